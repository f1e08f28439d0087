"""The plain records that flow through rowgrove: Call (what the gateway stored), Rollout (one run
of a harness), Row (one training sequence). No behaviour lives here.

Token exactness: every id in `Call.sampled_ids` and every position of a `Row` whose loss mask is 1
is a token the engine sampled, with the logprob the engine reported. Generated text is never
re-tokenized to fill these fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CALL_STATUSES = ("pending", "completed", "failed", "aborted")
ROLLOUT_STATUSES = ("open", "finished")


@dataclass
class Row:
    """One training sequence built from one chain of one rollout.

    `input_ids` is the full context the model saw; `loss_mask` is 1 exactly on tokens the engine
    sampled (and that this row is the first to train); `logprobs` holds the engine's logprob at
    sampled positions and 0 elsewhere. `reward` and `advantage` are the rollout's, copied onto
    every one of its rows: they are counted once per rollout, never once per row.
    `weight_versions` holds, per position, the weight version that sampled the token at every
    sampled position of the chain (whatever the loss mask says there) and -1 on every token the
    model did not sample (prompt, glue, tool output); None when a call on the chain has unknown
    versions (a ledger written before versions were recorded).
    """

    rollout_id: str
    group_id: str | None
    input_ids: Sequence[int]
    loss_mask: Sequence[int]
    reward: float | None = None
    valid: bool = True
    advantage: float | None = None
    logprobs: Sequence[float] | None = None
    segment: int = 0
    call_ids: Sequence[str] = ()
    mask_reason: str | None = None
    weight_versions: Sequence[int] | None = None
    images: Sequence[str] = ()         # pixel digests of the images in input_ids, in order (ledger media table)


@dataclass
class Call:
    """One model request served by the gateway, as stored in the ledger.

    A root stores its full prompt in `prompt_ids`; a continuation stores only the part it added
    after its parent's sampled tokens (template glue + newly rendered messages + generation
    prompt). `prompt_len` is always the full prompt length the engine saw.
    """

    id: str
    rollout_id: str
    ordinal: int                       # 1-based position among the rollout's calls
    parent_id: str | None
    root: bool
    status: str                        # one of CALL_STATUSES
    prompt_ids: np.ndarray             # int32: full prompt (root) or the new part (continuation)
    prompt_len: int
    sampled_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    logprobs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    finish_reason: str | None = None   # "stop" | "length" | "tool_calls" | None while pending
    request_hash: str = ""             # chain hash of the request's messages (h_n)
    summary_hash: str | None = None    # request chain extended by the response message
    response_hash: str | None = None   # canonical hash of the response message on its own
    request_key: str | None = None     # hash of the raw request body, for SDK retries
    response: dict[str, Any] | None = None   # the response body sent to the harness
    error: str | None = None
    created_at: float = 0.0
    completed_at: float | None = None
    history_drift: bool = False        # continuation that kept its parent's tokens where the template drifts
    weight_versions: np.ndarray | None = None  # int32, one per sampled id: the weight version that sampled it; None = unknown


@dataclass(frozen=True)
class CallOutline:
    """A call as its rollout's lineage shows it (`Ledger.call_outlines`): its place and outcome,
    without its token arrays or response."""

    id: str
    ordinal: int
    parent_id: str | None
    root: bool
    status: str
    prompt_len: int
    sampled: int                       # how many ids were sampled
    finish_reason: str | None
    history_drift: bool
    weight_range: tuple[int, int] | None  # (oldest, newest) weight version of its sampled ids; None = unknown or none
    hosted_tools_dropped: list[str] | None  # the hosted tools its request named that the model was not shown


@dataclass
class Rollout:
    """One run of a harness on one prompt. One reward, one validity, one advantage."""

    id: str
    group_id: str | None
    api_key: str
    status: str = "open"               # one of ROLLOUT_STATUSES
    metadata: dict[str, Any] = field(default_factory=dict)
    reward: float | None = None
    valid: bool = True
    record: dict[str, Any] | None = None   # {"messages": [...]} or {"conversations": [[...], ...]}
    created_at: float = 0.0
    finished_at: float | None = None
