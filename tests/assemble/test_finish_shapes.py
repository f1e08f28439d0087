"""Which finish shapes train what (docs/rows.md, "What a finish trains"). The record is the
harness's word: assistant messages train the calls they match; messages without any assistant
message train nothing (`nothing_to_train`); a finish with no record at all trains the traffic:
every completed call but the siblings a retry or resample superseded."""

from __future__ import annotations

import pytest
from assemble_standin import assistant, write_rollout

from rowgrove.assemble import build_rows, read_calls, record_shape, rollout_rows
from rowgrove.errors import InputError

# c1 ← c2 (a two-turn conversation), c3 a rejected sibling of c2
STEPS = [("c1", None, [1, 2], [101], "a"), ("c2", "c1", [3], [102, 103], "b"), ("c3", "c1", [4], [104], "x")]
Q = {"role": "user", "content": "q"}
O = {"role": "user", "content": "o"}


def _trained(rr) -> int:
    return sum(int(r.loss_mask.sum()) for r in rr.rows)


@pytest.mark.parametrize(("record", "shape"), [
    (None, "none"),
    ({}, "none"),
    ({"conversations": []}, "none"),
    ({"messages": []}, "none"),
    ({"conversations": [[]]}, "none"),
    ({"messages": [Q]}, "no_reply"),
    ({"messages": [Q, O, {"role": "tool", "tool_call_id": "t", "content": "r"}]}, "no_reply"),
    ({"conversations": [[Q], [O]]}, "no_reply"),
    ({"messages": [Q, assistant("a")]}, "assistant"),
    ({"conversations": [[Q], [O, assistant("a")]]}, "assistant"),
    ({"messages": [Q], "accepted_call_ids": ["c1"]}, "assistant"),
])
def test_record_shape(record, shape):
    assert record_shape(record) == shape


def test_record_shape_refuses_a_record_that_is_not_an_object():
    with pytest.raises(InputError, match="'messages' or 'conversations'"):
        record_shape(["not", "an", "object"])


def test_assistant_messages_train_the_matched_calls(ledger):
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, {"messages": [Q, assistant("a"), O, assistant("b")]},
                                            1.0))
    assert rr.invalid_reason is None and rr.metrics["source"] == "record"
    assert rr.chains == [["c1", "c2"]] and _trained(rr) == 3  # c3, the rejected sibling, is not trained


def test_a_record_without_an_assistant_message_trains_nothing(ledger):
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, {"messages": [Q]}, 0.0))
    assert rr.rows == [] and _trained(rr) == 0
    assert rr.reason_kinds == ["nothing_to_train"]
    assert "no assistant message" in rr.invalid_reason and '{"conversations": []}' in rr.invalid_reason
    assert rr.metrics["source"] == "record" and rr.metrics["accepted_calls"] == 0
    assert rr.metrics["trained_tokens"] == 0 and rr.metrics["delivered_fraction"] == 0.0


def test_conversations_without_an_assistant_message_train_nothing(ledger):
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, {"conversations": [[Q], [O]]}, 1.0))
    assert rr.rows == [] and rr.reason_kinds == ["nothing_to_train"]


def test_no_reply_is_reported_beside_the_harness_own_invalid_flag(ledger):
    # the reference agent's error path: only the prompt, valid=false
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, {"messages": [Q]}, 0.0, valid=False))
    assert rr.rows == [] and rr.reason_kinds == ["nothing_to_train", "harness_invalid"]


def test_no_record_trains_the_traffic(ledger):
    # c3 sent its own request (not c2's): a branch, not a retry, so both chains train
    for k, record in enumerate((None, {"conversations": []})):
        rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, record, 1.0, call_prefix=f"r{k}-"))
        assert rr.chains == [[f"r{k}-c1", f"r{k}-c2"], [f"r{k}-c1", f"r{k}-c3"]]
        assert rr.invalid_reason is None and rr.metrics["source"] == "traffic"
        assert rr.metrics["superseded_calls"] == 0 and rr.metrics["delivered_fraction"] == 1.0
        assert "no record" in rr.metrics["note"]


def test_no_record_drops_a_superseded_sibling(ledger):
    # c3 resent c2's request (a resample) and nothing continued either: the latest, c3, wins
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, None, 1.0, requests={"c3": "c2"}))
    assert rr.chains == [["c1", "c3"]] and rr.metrics["superseded_calls"] == 1
    # a later call continued c2: c2 wins over the later c3, and c4 trains after it
    steps = [*STEPS, ("c4", "c2", [5], [105], "y")]
    rr = rollout_rows(ledger, write_rollout(ledger, "g", steps, None, 1.0, requests={"c3": "c2"},
                                            call_prefix="k-"))
    assert rr.chains == [["k-c1", "k-c2", "k-c4"]] and rr.accepted == ["k-c1", "k-c2", "k-c4"]
    assert rr.invalid_reason is None and rr.metrics["superseded_calls"] == 1


def test_named_calls_with_a_user_only_record_are_trained(ledger):
    # a harness that rewrote every turn names the calls it kept: that is a reply, not "no reply"
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, {"messages": [Q], "accepted_call_ids": ["c1", "c2"]},
                                            1.0))
    assert rr.invalid_reason is None and rr.chains == [["c1", "c2"]] and _trained(rr) == 3


def test_build_rows_and_the_ledger_reader_agree(ledger):
    rid = write_rollout(ledger, "g", STEPS, {"messages": [Q]}, 0.0)
    pure = build_rows(ledger.get_rollout(rid), read_calls(ledger, rid))
    assert pure.reason_kinds == rollout_rows(ledger, rid).reason_kinds == ["nothing_to_train"]
