"""`accepted_call_ids`: a harness that rewrites the model's turns (smolagents re-sends tool calls
as assistant text, contents as lists of parts) names the calls it kept instead, and still gets
rows. Selection unit tests on stand-in rollouts; tests/frameworks/test_smolagents.py runs the
real thing through the gateway."""

from __future__ import annotations

import pytest
from assemble_standin import assistant, write_rollout

from rowgrove.assemble import rollout_rows
from rowgrove.assemble.build import build_rows
from rowgrove.assemble.read import read_finished_rollout
from rowgrove.assemble.select import check_accepted_call_ids, select_calls
from rowgrove.errors import BadRequest


def user(text):
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def rewritten(text):
    """An assistant turn as smolagents re-sends it: the harness's text, as a list of parts."""
    return {"role": "assistant", "content": [{"type": "text", "text": f"Calling tools:\n[{text!r}]"}]}


# two roots (the harness rewrote the history before the second call, so it is no continuation)
STEPS = [("c1", None, [1, 2, 3], [101, 102], "tool call 1"), ("c2", None, [1, 2, 3, 9], [103, 104], "final")]
SMOL = [user("task"), rewritten("get_weather"), user("Observation: sunny"), rewritten("final_answer")]


def _sel(ledger, record, steps=STEPS, **kw):
    rid = write_rollout(ledger, "g", steps, record, 1.0, **kw)
    ro, calls = read_finished_rollout(ledger, rid)
    return rid, select_calls(ro.record, calls)


def test_rewritten_turns_without_ids_stay_unmatched(ledger):
    rid = write_rollout(ledger, "g", STEPS, {"messages": SMOL}, 1.0)
    rr = rollout_rows(ledger, rid)
    assert rr.reason_kinds == ["unmatched_message"] and rr.metrics["unmatched_messages"] == 2
    assert rr.accepted == []


def test_named_calls_are_accepted_and_rewritten_turns_paired_in_order(ledger):
    rid, sel = _sel(ledger, {"messages": SMOL, "accepted_call_ids": ["c2", "c1"]})
    assert sel.accepted == {"c1", "c2"} and sel.problems == [] and sel.unmatched == []
    assert [(m.message, m.call_id, m.by) for m in sel.matches] == [(1, "c1", "accepted_id"), (3, "c2", "accepted_id")]
    rr = rollout_rows(ledger, rid)
    assert rr.invalid_reason is None and rr.metrics["unmatched_messages"] == 0
    assert rr.chains == [["c1"], ["c2"]]
    assert [list(r.input_ids) for r in rr.rows] == [[1, 2, 3, 101, 102], [1, 2, 3, 9, 103, 104]]
    assert [list(r.loss_mask) for r in rr.rows] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]]
    assert rr.metrics["delivered_fraction"] == 1.0


def test_union_of_hash_matches_and_named_ids(ledger):
    # c1 ← c2: the record keeps c1's message as sent and rewrites c2's; it names only c2
    steps = [("c1", None, [1], [101], "a"), ("c2", "c1", [2], [102], "b"), ("c3", "c1", [3], [103], "rejected")]
    record = {"messages": [user("q"), assistant("a"), user("o"), rewritten("b")], "accepted_call_ids": ["c2"]}
    rid, sel = _sel(ledger, record, steps)
    assert sel.accepted == {"c1", "c2"}
    assert [(m.call_id, m.by) for m in sel.matches] == [("c1", "hash"), ("c2", "accepted_id")]
    rr = rollout_rows(ledger, rid)
    assert rr.invalid_reason is None and rr.chains == [["c1", "c2"]] and rr.metrics["rejected_calls"] == 1
    assert list(rr.rows[0].loss_mask) == [0, 1, 0, 1]


def test_a_named_id_already_matched_pairs_no_message(ledger):
    # the harness names c1 (which its record also matches) and adds text the model never wrote
    steps = [("c1", None, [1], [101], "a")]
    record = {"messages": [user("q"), assistant("a"), assistant("my own summary")], "accepted_call_ids": ["c1"]}
    rid, sel = _sel(ledger, record, steps)
    assert sel.accepted == {"c1"} and [m.message for m in sel.unmatched] == [2]
    assert rollout_rows(ledger, rid).reason_kinds == ["unmatched_message"]


def test_more_rewritten_turns_than_named_calls_is_invalid(ledger):
    rid, sel = _sel(ledger, {"messages": SMOL + [rewritten("harness wrote this")], "accepted_call_ids": ["c1", "c2"]})
    assert sel.accepted == {"c1", "c2"} and [m.message for m in sel.unmatched] == [4]
    rr = rollout_rows(ledger, rid)
    assert rr.reason_kinds == ["unmatched_message"] and "conversation 0 message 4" in rr.invalid_reason
    assert len(rr.rows) == 2 and not any(r.valid for r in rr.rows)


def test_named_continuation_without_its_parent_skips_a_turn(ledger):
    steps = [("c1", None, [1], [101], "a"), ("c2", "c1", [2], [102], "b")]
    rid, _ = _sel(ledger, {"messages": [user("q"), rewritten("a"), user("o"), rewritten("b")],
                           "accepted_call_ids": ["c2"]}, steps)
    rr = rollout_rows(ledger, rid)
    # one rewritten message is paired with c2; the other is left over, and c1 is on c2's chain
    assert set(rr.reason_kinds) == {"unmatched_message", "skipped_turn"}


def test_pairing_spans_conversations_in_record_order(ledger):
    steps = STEPS + [("c3", None, [5], [105], "sub-agent")]
    record = {"conversations": [SMOL, [user("sub task"), rewritten("sub")]], "accepted_call_ids": ["c1", "c2", "c3"]}
    rid, sel = _sel(ledger, record, steps)
    assert [(m.conversation, m.message, m.call_id) for m in sel.matches] == [(0, 1, "c1"), (0, 3, "c2"), (1, 1, "c3")]
    assert rollout_rows(ledger, rid).invalid_reason is None


def test_unknown_and_failed_ids_are_problems(ledger):
    steps = STEPS + [("c3", None, [5], [105], "x")]
    rid, sel = _sel(ledger, {"messages": SMOL, "accepted_call_ids": ["c1", "c2", "chatcmpl-nope", "c3"]},
                    steps, fail=["c3"])
    assert sel.accepted == {"c1", "c2"}
    kinds = [k for k, _ in sel.problems]
    assert kinds == ["unknown_call_id", "unknown_call_id"]
    assert "chatcmpl-nope is not a call of this rollout" in sel.problems[0][1]
    assert "c3 is a call that did not complete (failed)" in sel.problems[1][1]


def test_unknown_id_makes_the_rollout_invalid(ledger):
    rid = write_rollout(ledger, "g", STEPS, {"messages": SMOL, "accepted_call_ids": ["c1", "c2", "chatcmpl-nope"]}, 1.0)
    rr = rollout_rows(ledger, rid)
    assert "unknown_call_id" in rr.reason_kinds and "chatcmpl-nope" in rr.invalid_reason
    assert rr.rows and not any(r.valid for r in rr.rows)


def test_ids_without_assistant_messages_select_the_named_calls(ledger):
    steps = STEPS + [("c3", None, [5], [105], "never kept")]
    rid = write_rollout(ledger, "g", steps, {"messages": [user("task")], "accepted_call_ids": ["c1", "c2"]}, 1.0)
    rr = rollout_rows(ledger, rid)
    assert rr.metrics["source"] == "record" and rr.accepted == ["c1", "c2"] and rr.invalid_reason is None


def test_ids_without_assistant_messages_at_select_level(ledger):
    _, sel = _sel(ledger, {"messages": [user("task")], "accepted_call_ids": ["c1"]})
    assert sel.accepted == {"c1"} and sel.matches == []


def test_build_rows_is_pure_on_a_record_with_ids(ledger):
    rid = write_rollout(ledger, "g", STEPS, {"messages": SMOL, "accepted_call_ids": ["c1", "c2"]}, 0.5)
    ro, calls = read_finished_rollout(ledger, rid)
    rr = build_rows(ro, list(reversed(calls)))
    assert rr.invalid_reason is None and [r.reward for r in rr.rows] == [0.5, 0.5]


def test_check_accepted_call_ids(ledger):
    assert check_accepted_call_ids(["a", "b", "a"]) == ["a", "b"]
    for bad in ("a", ["a", ""], ["a", 3], None, {"a": 1}):
        with pytest.raises(BadRequest) as e:
            check_accepted_call_ids(bad)
        assert e.value.param == "accepted_call_ids"
    rid = write_rollout(ledger, "g", STEPS + [("c3", None, [5], [105], "x")], None, 1.0, fail=["c3"])
    _, calls = read_finished_rollout(ledger, rid)
    assert check_accepted_call_ids(["c2", "c1"], calls) == ["c2", "c1"]
    with pytest.raises(BadRequest, match="chatcmpl-x is not a call of this rollout"):
        check_accepted_call_ids(["c1", "chatcmpl-x"], calls)
    with pytest.raises(BadRequest, match=r"c3 is a call that did not complete \(failed\).*\(\+1 more\)"):
        check_accepted_call_ids(["c3", "chatcmpl-x"], calls)
