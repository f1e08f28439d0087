"""Reassembly: a finished rollout's ledger → training rows, one per chain.

    ledger ──read──▶ calls ──select (match the record's assistant messages)──▶ accepted calls
          ──cut at roots, walk leaf → root──▶ chains ──join stored tokens──▶ rows ──io──▶ Parquet / JSONL

`build_rows` is pure (no I/O); `rollout_rows` reads one rollout from a ledger and builds it.
`rowgrove rows` and `rowgrove show` are thin shells over these functions.
"""

from rowgrove.assemble.build import RolloutRows, build_rows, record_shape
from rowgrove.assemble.io import read_rows, row_from_json, row_to_json, write_rows
from rowgrove.assemble.read import iter_finished, read_calls, read_finished_rollout
from rowgrove.ledger import Ledger


def rollout_rows(ledger: Ledger, rollout_id: str) -> RolloutRows:
    """Rows of one finished rollout of `ledger` (Conflict while it is open, NotFound if unknown)."""
    rollout, calls = read_finished_rollout(ledger, rollout_id)
    built = build_rows(rollout, calls)
    attach_images(built.rows, ledger.call_images(rollout_id))
    return built


def attach_images(rows: list, call_images: dict[str, list[str]]) -> None:
    """Give each row the images of its chain's last call's full prompt (which holds every image
    placeholder of the row's input_ids), from `Ledger.call_images`."""
    for row in rows:
        if row.call_ids and call_images.get(row.call_ids[-1]):
            row.images = list(call_images[row.call_ids[-1]])


__all__ = [
    "RolloutRows",
    "attach_images",
    "build_rows",
    "iter_finished",
    "read_calls",
    "read_rows",
    "record_shape",
    "rollout_rows",
    "row_from_json",
    "row_to_json",
    "write_rows",
]
