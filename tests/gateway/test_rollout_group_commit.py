"""A rollout created over HTTP joins the ledger's group commit (`Ledger.acreate_rollout`): it
shares one transaction with the calls of the same loop turns, is committed before its key is
handed out, and a duplicate id is refused (409) without costing the others their commit."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from rowgrove.errors import Conflict
from rowgrove.ledger import Ledger


def _committed(path, rollout_id: str) -> bool:
    with sqlite3.connect(str(path)) as db:  # another connection sees only committed rows
        return db.execute("SELECT 1 FROM rollouts WHERE id=?", (rollout_id,)).fetchone() is not None


def test_rollouts_created_together_share_one_commit_and_are_committed_when_returned(tmp_path):
    path = tmp_path / "ledger.db"
    led = Ledger(path)
    commits = []
    commit = led._commit_group

    def counted() -> None:
        if led._group_open:
            commits.append(len(led._group_waiters))
        commit()

    led._commit_group = counted  # type: ignore[method-assign]

    async def go():
        ros = await asyncio.gather(*(led.acreate_rollout(f"g{k}") for k in range(5)))
        assert all(_committed(path, ro.id) for ro in ros)
        with pytest.raises(Conflict):
            await asyncio.gather(led.acreate_rollout("g", rollout_id=ros[0].id), led.acreate_rollout("h"))
        return ros

    ros = asyncio.run(go())
    assert commits[0] == 5  # the five inserts: one transaction
    assert len({r.id for r in led.rollouts()}) == 6 and {r.id for r in ros} <= {r.id for r in led.rollouts()}
    led.close()
