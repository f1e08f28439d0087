"""The compaction agent and the engine-vs-trainer logprob gap the TRL on-policy tests drive through a gateway (tests/integrations/
test_trl_sync.py against the hf engine, tests/vllm_real/test_trl_loop.py against a real vLLM)."""

from __future__ import annotations

import numpy as np

from rowgrove.agents.compaction import compact, render_context
from rowgrove.integrations.harness import Episode


def compaction_agent(max_tokens: int = 8):
    """Three sampled turns; after each, the context keeps only the last round
    (`rowgrove.agents.compaction`, keep_last_rounds), so the third call is a new root: two rows
    per rollout or more. Reward: the characters the model wrote (it differs within a group unless the two
    wrote as many, so a step has non-zero advantages unless every group ties or is invalid)."""
    async def agent(client, prompt):
        head = [{"role": "user", "content": prompt}]
        rounds: list = []
        omitted = 0
        record = list(head)
        for turn in range(3):
            r = await client.chat.completions.create(model="policy", messages=render_context(head, rounds, omitted),
                                                     max_tokens=max_tokens, temperature=1.0)
            a = {"role": "assistant", "content": r.choices[0].message.content or ""}
            record.append(a)
            if turn < 2:
                note = {"role": "user", "content": f"step {turn + 1} done, go on"}
                record.append(note)
                rounds, omitted = compact("keep_last_rounds", [*rounds, [a, note]], omitted, keep_rounds=1)
        return Episode(reward=sum(len(m["content"]) for m in record if m["role"] == "assistant") / 10.0,
                       messages=record)

    return agent


def engine_gap(logprobs_fn, rows) -> float:
    """max |engine logprob - logprobs_fn(ids)| over every sampled token of `rows`."""
    worst = 0.0
    for r in rows:
        ids = [int(t) for t in r.input_ids]
        ref = np.asarray(logprobs_fn(ids))
        at = np.flatnonzero(np.asarray(r.loss_mask) == 1)
        assert len(at) and at[0] > 0
        worst = max(worst, float(np.max(np.abs(np.asarray(r.logprobs)[at] - ref[at - 1]))))
    return worst
