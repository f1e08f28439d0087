"""Selection, chains, masks and validity on stand-in rollouts in a real SQLite ledger."""

from __future__ import annotations

import numpy as np
import pytest
from assemble_standin import assistant, logprob_of, write_rollout

from rowgrove.assemble import build_rows, read_calls, rollout_rows
from rowgrove.errors import Conflict, NotFound


def user(text):
    return {"role": "user", "content": text}


def test_parallel_branches_train_shared_tokens_once(ledger):
    # c1 ← c2 ← {c3 ← c5, c4}: two accepted leaves (c5, c4) share c1, c2
    steps = [
        ("c1", None, [1, 2, 3], [101, 102], "a"),
        ("c2", "c1", [4], [103], "b"),
        ("c3", "c2", [5], [104], "left"),
        ("c4", "c2", [6], [105, 106], "right"),
        ("c5", "c3", [7], [107], "left done"),
    ]
    base = [user("q"), assistant("a"), user("o"), assistant("b")]
    rec = {"conversations": [base + [user("x"), assistant("left"), user("y"), assistant("left done")],
                             base + [user("z"), assistant("right")]]}
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, rec, 0.5))
    assert rr.invalid_reason is None
    assert rr.chains == [["c1", "c2", "c4"], ["c1", "c2", "c3", "c5"]]  # by leaf ordinal within a tree
    first, second = rr.rows
    assert list(first.input_ids) == [1, 2, 3, 101, 102, 4, 103, 6, 105, 106]
    assert list(first.loss_mask) == [0, 0, 0, 1, 1, 0, 1, 0, 1, 1]
    assert list(second.input_ids) == [1, 2, 3, 101, 102, 4, 103, 5, 104, 7, 107]
    assert list(second.loss_mask) == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]
    # shared sampled positions still carry the engine's logprobs; only the mask says "trained once"
    assert np.asarray(second.logprobs)[3] == np.float32(logprob_of(101))
    assert rr.metrics["trained_tokens"] == rr.metrics["generated_tokens"] == 7
    assert rr.metrics["delivered_fraction"] == 1.0


def test_injected_answer_makes_rollout_invalid_but_keeps_rows(ledger):
    steps = [("c1", None, [1, 2], [101], "a"), ("c2", "c1", [3], [102], "b")]
    rec = {"messages": [user("q"), assistant("a"), user("o"), assistant("b"), user("more"),
                        assistant("The final answer is 42, written by the harness")]}
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, rec, 1.0))
    assert rr.invalid_reason is not None
    assert "match no call" in rr.invalid_reason and "conversation 0 message 5" in rr.invalid_reason
    assert len(rr.rows) == 1 and not rr.rows[0].valid and rr.rows[0].mask_reason == rr.invalid_reason
    assert rr.metrics["unmatched_messages"] == 1
    assert list(rr.rows[0].input_ids) == [1, 2, 101, 3, 102]


def test_record_that_skips_a_turn_is_invalid(ledger):
    steps = [("c1", None, [1], [101], "a"), ("c2", "c1", [2], [102], "b"), ("c3", "c2", [3], [103], "c")]
    rec = {"messages": [user("q"), assistant("a"), user("o"), assistant("c")]}  # "b" edited away
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, rec, 1.0))
    assert rr.invalid_reason and "c2" in rr.invalid_reason and "skipped a turn" in rr.invalid_reason
    (row,) = rr.rows
    assert not row.valid
    assert list(row.loss_mask) == [0, 1, 0, 0, 0, 1]  # the skipped call's tokens are not accepted


def test_harness_invalid_flag_and_failed_calls(ledger):
    steps = [("c1", None, [1], [101], "a"), ("c2", "c1", [2], [102], "b")]
    rec = {"messages": [user("q"), assistant("a")]}
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, rec, 0.0, valid=False, fail=("c2",)))
    assert rr.invalid_reason and "valid=false" in rr.invalid_reason
    assert rr.metrics["failed_calls"] == 1 and rr.metrics["rejected_calls"] == 0
    assert [r.valid for r in rr.rows] == [False]


def test_failed_call_on_a_chain_is_named(ledger):
    steps = [("c1", None, [1], [101], "a"), ("c2", "c1", [2], [102], "b")]
    rid = write_rollout(ledger, "g", steps, {"messages": [assistant("a"), assistant("b")]}, 1.0)
    ro, calls = ledger.get_rollout(rid), read_calls(ledger, rid)
    calls[0].status, calls[0].error = "aborted", "server restarted"
    rr = build_rows(ro, calls)
    assert rr.invalid_reason and "c1 (aborted: server restarted)" in rr.invalid_reason


def test_no_messages_falls_back_to_each_roots_terminal_chain(ledger):
    # two roots (a sub-agent's conversation is a root of its own): each tree's last completed call
    # is walked up; c3, the sibling c4 replaced, is not
    steps = [("c1", None, [1], [101], "a"), ("c2", None, [2], [102], "b"), ("c3", "c2", [3], [103], "c"),
             ("c4", "c2", [4], [104], "d")]
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, None, 1.0))
    assert rr.invalid_reason is None
    assert rr.chains == [["c1"], ["c2", "c4"]]
    assert rr.metrics["source"] == "terminal_chain" and "terminal chain" in rr.metrics["note"]
    assert rr.metrics["delivered_fraction"] == pytest.approx(3 / 4)


def test_identical_texts_follow_lineage_and_order(ledger):
    # the same short reply at two different turns, plus a retry with the same text
    steps = [("c1", None, [1], [101], "ok"), ("c2", "c1", [2], [102], "ok"), ("c3", "c1", [3], [103], "ok"),
             ("c4", "c3", [4], [104], "done")]
    rec = {"messages": [user("q"), assistant("ok"), user("o"), assistant("ok"), user("p"), assistant("done")]}
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, rec, 1.0))
    assert rr.invalid_reason is None
    assert rr.accepted == ["c1", "c3", "c4"]  # c3, not the abandoned c2: c4 continues c3
    assert rr.metrics["rejected_calls"] == 1


def test_open_and_unknown_rollouts(ledger):
    ro = ledger.create_rollout("g")
    with pytest.raises(Conflict, match="still open"):
        rollout_rows(ledger, ro.id)
    with pytest.raises(NotFound):
        rollout_rows(ledger, "ro_nope")


def test_reward_copied_and_no_calls(ledger):
    rr = rollout_rows(ledger, write_rollout(ledger, "g", [], None, 0.25))
    assert rr.rows == [] and rr.invalid_reason and "no completed call" in rr.invalid_reason
    assert rr.reason_kinds == ["nothing_to_train"]


def test_reason_kinds_name_each_cause(ledger):
    steps = [("c1", None, [1], [101], "a"), ("c2", "c1", [2], [102], "b")]
    rec = {"messages": [assistant("b"), assistant("made up")]}
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, rec, 1.0, valid=False))
    assert rr.reason_kinds == ["unmatched_message", "harness_invalid", "skipped_turn"]
