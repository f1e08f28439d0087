"""Reassembly: a finished rollout's ledger → training rows, one per chain.

    ledger ──read──▶ calls ──select (match the record's assistant messages)──▶ accepted calls
          ──cut at roots, walk leaf → root──▶ chains ──join stored tokens──▶ rows ──io──▶ Parquet / JSONL

`build_rows` is pure (no I/O); `rollout_rows` reads one rollout from a ledger and builds it.
`rowgrove rows` and `rowgrove show` are thin shells over these functions.
"""

from rowgrove.assemble.build import RolloutRows, build_rows
from rowgrove.assemble.io import read_rows, row_from_json, row_to_json, write_rows
from rowgrove.assemble.read import iter_finished, read_calls, read_finished_rollout
from rowgrove.ledger import Ledger


def rollout_rows(ledger: Ledger, rollout_id: str) -> RolloutRows:
    """Rows of one finished rollout of `ledger` (Conflict while it is open, NotFound if unknown)."""
    rollout, calls = read_finished_rollout(ledger, rollout_id)
    return build_rows(rollout, calls)


__all__ = [
    "RolloutRows",
    "build_rows",
    "iter_finished",
    "read_calls",
    "read_rows",
    "rollout_rows",
    "row_from_json",
    "row_to_json",
    "write_rows",
]
