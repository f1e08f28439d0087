"""`rowgrove show`: a rollout's call lineage as a picture.

    rowgrove show --ledger runs/ledger.db --rollout ro_1234           # text drawing in the terminal
    rowgrove show --ledger runs/ledger.db --rollout ro_1234 --out forest.svg   # or .html, .png
    rowgrove show --ledger runs/ledger.db --rollout ro_1234 --model tiny --ids  # rows as text, ids too

A tree per root (a new root is a context rewrite, or a resample when an earlier root was the same
request), continuations under their parent, rejected calls ✗, accepted leaves ◉, the chain walked
in each tree highlighted, and the rows it gave. With `--model` (the model whose tokenizer the
gateway served) the rows are also shown as decoded text with the trained spans marked, and with
`--ids` every span's token ids after it.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", required=True, help="SQLite ledger file written by `rowgrove serve`")
    p.add_argument("--rollout", required=True, help="the rollout id (ro_…)")
    p.add_argument("--out", help="write a picture instead of printing: *.svg, *.html or *.png")
    p.add_argument("--model", help="model dir or tiny spec whose tokenizer decodes the rows: show them as "
                                   "text with the trained spans marked (in the terminal and in *.html)")
    p.add_argument("--ids", action="store_true", help="with --model: each span's token ids too")


def run(args: argparse.Namespace) -> int:
    from rowgrove.assemble import build_rows, read_calls
    from rowgrove.assemble.picture import render_text, write_picture
    from rowgrove.errors import InputError
    from rowgrove.ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        rollout = ledger.get_rollout(args.rollout)
        calls = read_calls(ledger, rollout.id)
        images = ledger.call_images(rollout.id)  # which calls carried which images (vision models)
    # an open rollout has no record yet: its picture shows what a finish with no record would train now
    built = build_rows(rollout, calls)
    if args.ids and not args.model:
        raise InputError("--ids shows the token ids of the decoded rows: give --model too (e.g. --model tiny)")
    tok = None
    if args.model:
        from rowgrove.model.load import load_tokenizer

        tok = load_tokenizer(args.model)
    if args.out:
        path = write_picture(calls, built, args.out, images=images)
        if tok is not None and path.suffix.lower() in (".html", ".htm"):
            from rowgrove.assemble.rowtext import rows_html

            page = path.read_text(encoding="utf-8")
            path.write_text(page.replace("</body>", rows_html(built.rows, tok, ids=args.ids) + "</body>"),
                            encoding="utf-8")
        print(f"wrote {path}: {len(calls)} calls, {len(built.rows)} rows")
    else:
        print(render_text(calls, built, images=images), end="")
        if tok is not None:
            from rowgrove.assemble.rowtext import rows_text

            print("rows as text:\n" + rows_text(built.rows, tok, ids=args.ids), end="")
    return 0
