"""Reading a ledger for reassembly: only the columns rows need, in as few queries as possible.

`Ledger.calls()` also decodes each call's JSON response body, which reassembly never reads; at
~1,000 tokens per call that decode costs more than building the row. These readers skip it, read
the token blobs as zero-copy numpy views, and read a whole ledger in one streaming query through
their own read-only connection (WAL lets it run beside a live gateway).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

from rowgrove.errors import Conflict
from rowgrove.ledger import Ledger
from rowgrove.ledger.codec import rollout_from_row, unpack_floats, unpack_ids, unpack_versions
from rowgrove.ledger.schema import ROLLOUT_COLUMNS, table_columns
from rowgrove.types import Call, Rollout


def _cols(present: set[str] | frozenset[str]) -> str:
    """The columns rows need, for a calls table holding `present` (an older ledger opened
    read-only has no weight_versions: its calls read as unknown)."""
    return (
        "c.id, c.rollout_id, c.ordinal, c.parent_id, c.root, c.status, c.prompt_ids, c.prompt_len, "
        "c.sampled_ids, c.logprobs, c.finish_reason, c.request_hash, c.summary_hash, c.response_hash, "
        # `error` is stored after the response body: reading it for every call would walk the body's
        # overflow pages, so it is read only where there can be one
        "CASE WHEN c.status != 'completed' THEN c.error END, "
        + ("c.weight_versions" if "weight_versions" in present else "NULL")
    )


def _call(r: tuple) -> Call:
    return Call(
        id=r[0], rollout_id=r[1], ordinal=r[2], parent_id=r[3], root=bool(r[4]), status=r[5],
        prompt_ids=unpack_ids(r[6]), prompt_len=r[7], sampled_ids=unpack_ids(r[8]),
        logprobs=unpack_floats(r[9]), finish_reason=r[10], request_hash=r[11],
        summary_hash=r[12], response_hash=r[13], error=r[14], weight_versions=unpack_versions(r[15]),
    )


def read_calls(ledger: Ledger, rollout_id: str) -> list[Call]:
    """The rollout's calls in ordinal order, without their response bodies."""
    with ledger._lock:
        cols = _cols(ledger.call_table_columns)
        rows = ledger._db.execute(
            f"SELECT {cols} FROM calls c WHERE c.rollout_id=? ORDER BY c.ordinal", (rollout_id,)
        ).fetchall()
    return [_call(r) for r in rows]


def read_finished_rollout(ledger: Ledger, rollout_id: str) -> tuple[Rollout, list[Call]]:
    """One finished rollout and its calls; Conflict while it is still open."""
    ro = ledger.get_rollout(rollout_id)
    if ro.status != "finished":
        raise Conflict(
            f"rollout {rollout_id} is still open: finish it (POST /v1/rollouts/{rollout_id}/finish) before asking for rows"
        )
    return ro, read_calls(ledger, rollout_id)


def _connect_readonly(path: str) -> sqlite3.Connection | None:
    p = Path(path)
    if not p.exists():
        return None
    db = sqlite3.connect(f"file:{p.resolve()}?mode=ro", uri=True, isolation_level=None)
    # token blobs span overflow pages: memory-mapped reads are about twice as fast as read()
    db.execute("PRAGMA mmap_size=17179869184")
    db.execute("PRAGMA cache_size=-262144")
    return db


def iter_finished(ledger: Ledger | str | Path) -> Iterator[tuple[Rollout, list[Call]]]:
    """Every finished rollout with its calls, in creation order, from one read snapshot: one query
    for the rollouts, then one indexed query per rollout (a single joined query would sort every
    blob in a temporary B-tree to keep the rollouts' order)."""
    path = ledger.path if isinstance(ledger, Ledger) else str(ledger)
    db = _connect_readonly(path)
    if db is None:
        if not isinstance(ledger, Ledger):
            Ledger(path, readonly=True)  # raises NotFound naming the file
        assert isinstance(ledger, Ledger)
        for ro in ledger.rollouts(status="finished"):
            yield ro, read_calls(ledger, ro.id)
        return
    try:
        db.execute("BEGIN")  # one snapshot for both queries, even beside a live gateway
        ros = [
            rollout_from_row(r)
            for r in db.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE status='finished' ORDER BY created_at, id"
            )
        ]
        sql = f"SELECT {_cols(table_columns(db, 'calls'))} FROM calls c WHERE c.rollout_id=? ORDER BY c.ordinal"
        for ro in ros:
            yield ro, [_call(r) for r in db.execute(sql, (ro.id,))]
    finally:
        db.close()


def count_finished(ledger: Ledger | str | Path) -> int:
    """How many finished rollouts the ledger holds (for a progress bar)."""
    if isinstance(ledger, Ledger):
        return ledger.count("finished")
    with Ledger(ledger, readonly=True) as lg:
        return lg.count("finished")
