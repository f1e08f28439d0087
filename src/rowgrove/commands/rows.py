"""`rowgrove rows`: every finished rollout of a ledger → training rows with advantages.

    rowgrove rows --ledger runs/ledger.db --out rows.parquet
    rowgrove rows --ledger runs/ledger.db --out rows.jsonl --estimator dr_grpo
    rowgrove rows --ledger runs/ledger.db --out rows.parquet --exclude-group 'eval-*'
    rowgrove rows --ledger gw0.sqlite --ledger gw1.sqlite --out rows.parquet   # several gateways

Open (unfinished) rollouts have no rows yet: they are skipped, and one line on stderr says how
many. Rows come from `rowgrove.assemble` (one per chain), advantages from
`rowgrove.algo.assign_advantages` (one per rollout, baseline per group_id). Invalid rollouts keep
their rows, `valid=false` with the reason, and take no part in any baseline. Several `--ledger`
files (one per gateway) are merged (`rowgrove.assemble.ledgers`): baselines span them, and a
rollout id found in two ledgers is an error naming it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rowgrove.commands._select import add_group_arguments, group_filter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", required=True, action="append",
                   help="SQLite ledger file written by `rowgrove serve`; repeat it to merge the ledgers of several gateways")
    p.add_argument("--out", required=True, help="output file: *.parquet or *.jsonl")
    p.add_argument("--estimator", default="grpo", choices=("grpo", "dr_grpo", "rloo"),
                   help="advantage estimator (default grpo)")
    p.add_argument("--no-std", action="store_true", help="do not divide advantages by the group's std")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary line")
    add_group_arguments(p)  # whole groups in or out: the baselines of the groups kept do not change


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rowgrove.algo import assign_advantages
    from rowgrove.assemble import write_rows
    from rowgrove.assemble.io import check_out_path
    from rowgrove.assemble.ledgers import rows_from_ledgers
    from rowgrove.assemble.read import count_finished
    from rowgrove.errors import name_some

    check_out_path(Path(args.out))  # refuse a bad --out before reading anything
    total = sum(count_finished(path) for path in args.ledger)
    show_bar = not args.quiet and sys.stderr.isatty() and total >= 200

    def bar(it):
        return tqdm(it, total=total, disable=not show_bar, unit="rollout", file=sys.stderr, desc="rows")

    merged = rows_from_ledgers(args.ledger, progress=bar, keep=group_filter(args.group, args.exclude_group))
    still_open = merged.open_ids
    if still_open:  # said even with --quiet: rows that are not there must not pass unnoticed
        n = len(still_open)
        print(f"rowgrove rows: skipped {n} open rollout{'s' if n != 1 else ''} ({name_some(still_open)}): "
              f"{'they have' if n != 1 else 'it has'} no rows until finished (POST /v1/rollouts/ID/finish)",
              file=sys.stderr)
    rows, invalid, n_rollouts = merged.rows, merged.reason_kinds, merged.rollouts
    rows = assign_advantages(rows, estimator=args.estimator, scale_by_std=not args.no_std)
    write_rows(rows, args.out)
    if not args.quiet:
        per = len(rows) / n_rollouts if n_rollouts else 0.0
        n_invalid = len({r.rollout_id for r in rows if not r.valid})
        why = "; ".join(f"{k} ×{v}" for k, v in invalid.most_common(4))
        print(f"{n_rollouts} rollouts → {len(rows)} rows ({per:.2f} per rollout) → {args.out}; "
              f"{n_invalid} invalid" + (f" ({why})" if why else ""))
    return 0
