"""Stand-in rollouts written into a real SQLite ledger the way the gateway writes them.

`write_rollout(ledger, group_id, steps, record_messages, reward)` takes steps
`(call_id, parent_id, prompt_ids, sampled_ids, reply_text)`, begins and completes each call with
the hashes the gateway computes (response_hash = message_hash(response message),
summary_hash = chain_step(h_n, response_hash)), then finishes the rollout with the record.
`versions` maps call ids to the weight version of each sampled id (calls it omits: unknown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rowgrove.hashing import chain_hashes, chain_start, chain_step, message_hash
from rowgrove.ledger import Ledger


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def logprob_of(token: int) -> float:
    """The stand-in engine's logprob for a sampled token: distinct per token, exact in float32."""
    return float(np.float32(-(token % 97) / 64.0 - 0.015625))


Step = tuple[str, "str | None", Sequence[int], Sequence[int], str]


def write_rollout(
    ledger: Ledger,
    group_id: str,
    steps: Sequence[Step],
    record: dict[str, Any] | None,
    reward: float,
    *,
    rollout_id: str | None = None,
    valid: bool = True,
    fail: Sequence[str] = (),
    call_prefix: str = "",
    versions: Mapping[str, Sequence[int]] | None = None,
    requests: Mapping[str, str] | None = None,
) -> str:
    """`requests`: call id -> a request key; calls given the same key sent the same request
    (a retry, a resample), the others each their own."""
    ro = ledger.create_rollout(group_id, rollout_id=rollout_id)
    full: dict[str, int] = {}
    h0 = chain_start(None, None)
    for cid, parent, prompt, sampled, text in steps:
        prompt_len = len(prompt) + (full[parent] if parent is not None else 0)
        request = [{"role": "user", "content": f"request for {(requests or {}).get(cid, cid)}"}]
        h_n = chain_hashes(request, h0)[-1]
        call_id = call_prefix + cid
        ledger.begin_call(
            ro.id, parent_id=None if parent is None else call_prefix + parent,
            prompt_ids=list(prompt), prompt_len=prompt_len, request_hash=h_n.hex(), call_id=call_id,
        )
        if cid in fail:
            ledger.end_call(call_id, "failed", "engine crashed", sampled_ids=list(sampled),
                            logprobs=[logprob_of(t) for t in sampled], weight_versions=(versions or {}).get(cid))
            continue
        msg = assistant(text)
        digest = message_hash(msg)
        ledger.complete_call(
            call_id, sampled_ids=list(sampled), logprobs=[logprob_of(t) for t in sampled],
            finish_reason="stop", summary_hash=chain_step(h_n, digest).hex(), response_hash=digest.hex(),
            response={"choices": [{"message": msg}]}, weight_versions=(versions or {}).get(cid),
        )
        full[cid] = prompt_len + len(sampled)
    ledger.finish_rollout(ro.id, record, reward, valid=valid)
    return ro.id


