"""REGRESSION LOCK: capture → rows → advantages for seed 003's two pictures (and seed 000's sums).

If one of these breaks, training behaviour changed — do not fix the test.

Pinned behaviours:
1. Compaction off: 9 calls, one tree c1←c2←c3←{c4 ✗, c5←c6←{c7 ✗, c8←c9}}; one row of 21 tokens
   [10,11,1001, 20,21,1002, 30,31,1003, 50,51,1005, 60,61,1006, 80,81,1008, 90,91,1009],
   7 with gradient (the sampled 100x tokens), call_ids c1 c2 c3 c5 c6 c8 c9; c4 and c7 add nothing.
2. Compaction every 2 actions: roots c1, c3, c6, c9 → four rows, in this order,
   [10,11,1001,20,21,1002], [10,11,1003,50,51,1005], [10,11,1006,80,81,1008], [10,11,1009].
3. A retry with the same text as the call it replaced (c4/c5, c7/c8) is matched to the retry,
   both when a later turn continues it (lineage) and when nothing does (most recent).
4. Every row carries the rollout's one reward (1.0); with a second rollout of reward 0 in the
   same group, dr_grpo (and grpo without std scaling) gives +0.5 to all four rows and −0.5 to
   the other rollout's row: one advantage per rollout, however many rows it became.
5. Loss mask 1 exactly on sampled tokens, with the engine's logprobs there and 0 elsewhere.

The stand-in is the seed test's: a root's prompt is [10, 11]; call i adds two observation tokens
[10i, 10i+1] and samples [1000+i].
"""

from __future__ import annotations

import numpy as np
import pytest
from assemble_standin import assistant, logprob_of, write_rollout

from rowgrove.algo import assign_advantages
from rowgrove.assemble import rollout_rows

# action k is the text of the k-th accepted action; c4/c5 and c7/c8 share a text (the seed's stand-in)
TEXT = {1: "action 1", 2: "action 2", 3: "action 3", 4: "action 4", 5: "action 4",
        6: "action 5", 7: "action 6", 8: "action 6", 9: "action 7"}
ACCEPTED = ["c1", "c2", "c3", "c5", "c6", "c8", "c9"]


def steps(parents: dict[int, int | None]):
    out = []
    for i in range(1, 10):
        p = parents[i]
        prompt = [10, 11] if p is None else [10 * i, 10 * i + 1]
        out.append((f"c{i}", None if p is None else f"c{p}", prompt, [1000 + i], TEXT[i]))
    return out


NO_COMPACTION = {1: None, 2: 1, 3: 2, 4: 3, 5: 3, 6: 5, 7: 6, 8: 6, 9: 8}
EVERY_2 = {1: None, 2: 1, 3: None, 4: 3, 5: 3, 6: None, 7: 6, 8: 6, 9: None}


def record(compacted: bool) -> dict:
    """The agent's own history: every accepted action once, observations, and (compacted) the
    summaries it wrote at each rewrite — messages never matched, never trained."""
    msgs = [{"role": "system", "content": "you are an agent"}, {"role": "user", "content": "task"}]
    for k in range(1, 8):
        msgs.append(assistant(f"action {k}"))
        msgs.append({"role": "tool", "tool_call_id": f"t{k}", "content": f"observation {k}"})
        if compacted and k in (2, 4, 6):
            msgs.append({"role": "user", "content": f"summary of actions 1-{k}"})
    return {"messages": msgs}


def _check_exact(rows, by_call_sampled):
    for row in rows:
        ids = np.asarray(row.input_ids)
        mask = np.asarray(row.loss_mask)
        lps = np.asarray(row.logprobs)
        assert set(np.unique(mask)) <= {0, 1}
        assert all(1000 < t < 1010 for t in ids[mask == 1])
        assert all(t < 1000 for t in ids[mask == 0])
        assert np.array_equal(lps[mask == 1], np.array([logprob_of(t) for t in ids[mask == 1]], np.float32))
        assert not lps[mask == 0].any()


def test_compaction_off_one_tree_one_row(ledger):
    rid = write_rollout(ledger, "g0", steps(NO_COMPACTION), record(False), 1.0, rollout_id="g0_s")
    rr = rollout_rows(ledger, rid)
    assert rr.invalid_reason is None
    assert rr.accepted == ACCEPTED
    assert rr.chains == [ACCEPTED]
    (row,) = rr.rows
    assert list(row.input_ids) == [10, 11, 1001, 20, 21, 1002, 30, 31, 1003, 50, 51, 1005,
                                   60, 61, 1006, 80, 81, 1008, 90, 91, 1009]
    assert len(row.input_ids) == 21 and int(np.sum(row.loss_mask)) == 7
    assert list(row.call_ids) == ACCEPTED
    assert row.reward == 1.0 and row.valid and row.mask_reason is None and row.advantage is None
    _check_exact(rr.rows, None)
    m = rr.metrics
    assert (m["calls"], m["roots"], m["rows"], m["rejected_calls"], m["unmatched_messages"]) == (9, 1, 1, 2, 0)
    assert (m["generated_tokens"], m["trained_tokens"]) == (9, 7)
    assert m["delivered_fraction"] == pytest.approx(7 / 9)


def test_compaction_every_two_actions_four_rows_and_advantages(ledger):
    rid = write_rollout(ledger, "g0", steps(EVERY_2), record(True), 1.0, rollout_id="g0_s")
    rr = rollout_rows(ledger, rid)
    assert rr.invalid_reason is None
    assert rr.accepted == ACCEPTED
    assert rr.chains == [["c1", "c2"], ["c3", "c5"], ["c6", "c8"], ["c9"]]
    assert [list(r.input_ids) for r in rr.rows] == [
        [10, 11, 1001, 20, 21, 1002],
        [10, 11, 1003, 50, 51, 1005],
        [10, 11, 1006, 80, 81, 1008],
        [10, 11, 1009],
    ]
    assert [r.segment for r in rr.rows] == [0, 1, 2, 3]
    assert [int(np.sum(r.loss_mask)) for r in rr.rows] == [2, 2, 2, 1]
    assert all(r.reward == 1.0 and r.valid for r in rr.rows)
    _check_exact(rr.rows, None)
    assert rr.metrics["roots"] == 4 and rr.metrics["rows"] == 4 and rr.metrics["rejected_calls"] == 2

    # seed 000: the other rollout of the group, not compacted, reward 0
    other = write_rollout(ledger, "g0", steps(NO_COMPACTION), record(False), 0.0,
                          rollout_id="g1_s", call_prefix="g1:")
    rows = rr.rows + rollout_rows(ledger, other).rows
    assert len(rows) == 5
    for estimator, std in (("dr_grpo", True), ("grpo", False)):
        out = assign_advantages(rows, estimator=estimator, scale_by_std=std)
        assert [r.advantage for r in out] == pytest.approx([0.5, 0.5, 0.5, 0.5, -0.5])
