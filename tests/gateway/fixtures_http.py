"""Shared pieces of the gateway's HTTP tests: one scripted engine per template (cached for the
process), an engine wrapper that can be slowed down or made to fail, ledger dumps to prove that a
rejected request changed nothing, and prompt reconstruction from the ledger.

Import from test modules: `from fixtures_http import ...` (pytest puts this directory on sys.path).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rowgrove.engines import make_engine
from rowgrove.engines.base import Generation, SamplingParams
from rowgrove.ledger import Ledger
from rowgrove.types import Call

SPECS = ("tiny", "tiny-qwen3", "tiny-llama3")


@functools.cache
def scripted_engine(spec: str):
    """One scripted engine per model spec for the whole test process (model load is the cost)."""
    import torch

    torch.set_num_threads(1)
    return make_engine("scripted", spec)


class TestEngine:
    """A scripted engine with knobs: `delay` seconds before answering (cancellable), `fail` raised
    instead of answering. Records each prompt it was asked for and each cancellation."""

    __test__ = False

    def __init__(self, inner: Any):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.delay = 0.0
        self.fail: BaseException | None = None
        self.prompts: list[list[int]] = []
        self.cancelled = 0

    def reset(self) -> None:
        self.delay = 0.0
        self.fail = None

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        self.prompts.append(list(prompt_ids))
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail is not None:
            raise self.fail
        return await self.inner.generate(prompt_ids, sampling, hints=hints)

    async def aclose(self) -> None:
        """The inner engine is shared across tests: nothing to close."""


def dump_ledger(path: str | Path) -> tuple[list[tuple], list[tuple]]:
    """Every row of the rollouts and calls tables, ordered: equal dumps mean an unchanged ledger."""
    db = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True)
    try:
        rollouts = db.execute("SELECT * FROM rollouts ORDER BY id").fetchall()
        calls = db.execute("SELECT * FROM calls ORDER BY id").fetchall()
    finally:
        db.close()
    return rollouts, calls


def full_prompt(ledger: Ledger, call: Call) -> list[int]:
    """A call's full prompt rebuilt from the ledger alone: a root's stored prompt; a continuation's
    parent full prompt + parent sampled ids + its own stored new part."""
    if call.parent_id is None:
        return call.prompt_ids.tolist()
    parent = ledger.get_call(call.parent_id)
    return full_prompt(ledger, parent) + parent.sampled_ids.tolist() + call.prompt_ids.tolist()


def assert_continuation(ledger: Ledger, call: Call, parent: Call) -> None:
    """The call continues `parent` token for token, and its stored part is only the new part."""
    assert call.parent_id == parent.id and not call.root
    parent_ctx = full_prompt(ledger, parent) + parent.sampled_ids.tolist()
    full = full_prompt(ledger, call)
    assert full[: len(parent_ctx)] == parent_ctx
    assert full == parent_ctx + call.prompt_ids.tolist()
    assert call.prompt_len == len(full)
    assert len(call.prompt_ids) < call.prompt_len


def as_ids(x: Any) -> list[int]:
    return np.asarray(x).astype(int).tolist()
