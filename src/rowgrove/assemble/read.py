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
from rowgrove.ledger.store import _ROLLOUT_COLUMNS, _rollout_from_row, unpack_floats, unpack_ids
from rowgrove.types import Call, Rollout

_COLS = (
    "c.id, c.rollout_id, c.ordinal, c.parent_id, c.root, c.status, c.prompt_ids, c.prompt_len, "
    "c.sampled_ids, c.logprobs, c.finish_reason, c.request_hash, c.summary_hash, c.response_hash, "
    "c.error"
)


def _call(r: tuple) -> Call:
    return Call(
        id=r[0], rollout_id=r[1], ordinal=r[2], parent_id=r[3], root=bool(r[4]), status=r[5],
        prompt_ids=unpack_ids(r[6]), prompt_len=r[7], sampled_ids=unpack_ids(r[8]),
        logprobs=unpack_floats(r[9]), finish_reason=r[10], request_hash=r[11],
        summary_hash=r[12], response_hash=r[13], error=r[14],
    )


def read_calls(ledger: Ledger, rollout_id: str) -> list[Call]:
    """The rollout's calls in ordinal order, without their response bodies."""
    with ledger._lock:
        rows = ledger._db.execute(
            f"SELECT {_COLS} FROM calls c WHERE c.rollout_id=? ORDER BY c.ordinal", (rollout_id,)
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
    return sqlite3.connect(f"file:{p.resolve()}?mode=ro", uri=True, isolation_level=None)


def iter_finished(ledger: Ledger | str | Path) -> Iterator[tuple[Rollout, list[Call]]]:
    """Every finished rollout with its calls, in creation order: one query for the rollouts and
    one streaming query for all their calls."""
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
            _rollout_from_row(r)
            for r in db.execute(
                f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE status='finished' ORDER BY created_at, id"
            )
        ]
        cur = db.execute(
            f"SELECT {_COLS} FROM rollouts r JOIN calls c ON c.rollout_id = r.id "
            "WHERE r.status='finished' ORDER BY r.created_at, r.id, c.ordinal"
        )
        pending: tuple | None = None
        for ro in ros:
            calls: list[Call] = []
            if pending is not None:
                if pending[1] != ro.id:
                    yield ro, calls
                    continue
                calls.append(_call(pending))
                pending = None
            for r in cur:
                if r[1] != ro.id:
                    pending = r
                    break
                calls.append(_call(r))
            yield ro, calls
    finally:
        db.close()


def count_finished(ledger: Ledger | str | Path) -> int:
    """How many finished rollouts the ledger holds (for a progress bar)."""
    if isinstance(ledger, Ledger):
        return ledger.count("finished")
    with Ledger(ledger, readonly=True) as lg:
        return lg.count("finished")
