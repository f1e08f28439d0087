"""`rowgrove show`: a rollout's call lineage as a picture.

    rowgrove show --ledger runs/ledger.db --rollout ro_1234           # text drawing in the terminal
    rowgrove show --ledger runs/ledger.db --rollout ro_1234 --out forest.svg   # or .html, .png

A tree per root (a new root is a context rewrite, or a resample when an earlier root was the same
request), continuations under their parent, rejected calls ✗, accepted leaves ◉, the chain walked
in each tree highlighted, and the rows it gave.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", required=True, help="SQLite ledger file written by `rowgrove serve`")
    p.add_argument("--rollout", required=True, help="the rollout id (ro_…)")
    p.add_argument("--out", help="write a picture instead of printing: *.svg, *.html or *.png")


def run(args: argparse.Namespace) -> int:
    from rowgrove.assemble import build_rows, read_calls
    from rowgrove.assemble.picture import render_text, write_picture
    from rowgrove.ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        rollout = ledger.get_rollout(args.rollout)
        calls = read_calls(ledger, rollout.id)
        images = ledger.call_images(rollout.id)  # which calls carried which images (vision models)
    # an open rollout has no record yet: its picture shows the terminal chain it would give now
    built = build_rows(rollout, calls)
    if args.out:
        path = write_picture(calls, built, args.out, images=images)
        print(f"wrote {path}: {len(calls)} calls, {len(built.rows)} rows")
    else:
        print(render_text(calls, built, images=images), end="")
    return 0
