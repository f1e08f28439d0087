"""`rowgrove ls`: the rollouts of a ledger, one line each.

    rowgrove ls --ledger runs/demo/ledger.sqlite
    rowgrove ls --ledger runs/demo/ledger.sqlite --exclude-group 'eval-*' --invalid

Columns: id, group, status, reward, calls, roots, rows (what `rowgrove rows` would build from it
now) and the mask reason (the short kinds, see `rowgrove.assemble.build.REASONS`; "-" when the
rollout is valid or still open). `rowgrove show --rollout ID` draws one of them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from rowgrove.commands._select import add_group_arguments

if TYPE_CHECKING:
    from rowgrove.ledger import Ledger

COLUMNS = ("id", "group", "status", "reward", "calls", "roots", "rows", "mask reason")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", required=True, help="SQLite ledger file written by `rowgrove serve`")
    add_group_arguments(p)
    p.add_argument("--status", choices=("open", "finished"), help="only rollouts with this status")
    p.add_argument("--invalid", action="store_true", help="only rollouts that are masked (with a reason)")


def rollout_lines(ledger: Ledger, args: argparse.Namespace) -> tuple[list[tuple[str, ...]], int]:
    """(one tuple of COLUMNS per rollout that passes the filters, rollouts in the ledger)."""
    from rowgrove.assemble import build_rows, read_calls
    from rowgrove.commands._select import group_filter

    keep = group_filter(args.group, args.exclude_group)
    rollouts = ledger.rollouts(args.status)
    out = []
    for ro in rollouts:
        if not keep(ro.group_id):
            continue
        calls = read_calls(ledger, ro.id)
        built = build_rows(ro, calls)
        masked = ro.status == "finished" and not built.valid  # an open rollout is not judged yet
        if args.invalid and not masked:
            continue
        reward = "-" if ro.reward is None else f"{ro.reward:.4g}"
        out.append((ro.id, ro.group_id or "-", ro.status, reward, str(len(calls)), str(built.metrics["roots"]),
                    str(len(built.rows)), ",".join(built.reason_kinds) if masked else "-"))
    return out, ledger.count()


def run(args: argparse.Namespace) -> int:
    from rowgrove.ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        lines, total = rollout_lines(ledger, args)
    widths = [max(len(c), *(len(line[i]) for line in lines)) for i, c in enumerate(COLUMNS)]
    for line in [COLUMNS, *lines]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    print(f"{len(lines)} of {total} rollouts")
    return 0
