"""The SQLite ledger: a real file, WAL, packed token blobs, states that only move forward."""

import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.errors import Conflict, InputError, NotFound
from rowgrove.ledger import Ledger


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.sqlite") as led:
        yield led


def test_wal_mode_and_schema_version(tmp_path):
    Ledger(tmp_path / "l.sqlite").close()
    db = sqlite3.connect(tmp_path / "l.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    db.commit()
    db.close()
    with pytest.raises(InputError, match="schema version 99"):
        Ledger(tmp_path / "l.sqlite")


@settings(max_examples=25, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 2**31 - 1), max_size=50),
    sampled=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.floats(-50, 0, width=32)), max_size=50),
)
def test_call_tokens_round_trip_exactly(tmp_path_factory, prompt, sampled):
    with Ledger(tmp_path_factory.mktemp("l") / "l.sqlite") as led:
        ro = led.create_rollout("g")
        call = led.begin_call(ro.id, parent_id=None, prompt_ids=prompt, prompt_len=len(prompt), request_hash="h")
        ids = [s for s, _ in sampled]
        lps = [lp for _, lp in sampled]
        led.complete_call(call.id, sampled_ids=ids, logprobs=lps, finish_reason="stop",
                          summary_hash="s", response_hash="r", response={"id": call.id})
        got = led.get_call(call.id)
        assert got.prompt_ids.tolist() == prompt
        assert got.sampled_ids.tolist() == ids
        assert np.array_equal(got.logprobs, np.asarray(lps, np.float32))
        assert got.status == "completed" and got.response == {"id": call.id}


def test_ordinals_parents_and_states(ledger):
    ro = ledger.create_rollout("g", {"task": 1})
    c1 = ledger.begin_call(ro.id, parent_id=None, prompt_ids=[1, 2], prompt_len=2, request_hash="a")
    c2 = ledger.begin_call(ro.id, parent_id=c1.id, prompt_ids=[3], prompt_len=5, request_hash="b", request_key="k")
    assert (c1.ordinal, c2.ordinal, c1.root, c2.root) == (1, 2, True, False)
    ledger.end_call(c2.id, "aborted", "client went away", sampled_ids=[7], logprobs=[-0.5])
    with pytest.raises(Conflict, match="not pending"):
        ledger.complete_call(c2.id, sampled_ids=[1], logprobs=[0.0], finish_reason="stop",
                             summary_hash="s", response_hash="r", response=None)
    assert [c.status for c in ledger.calls(ro.id)] == ["pending", "aborted"]
    assert ledger.find_retry(ro.id, "k").id == c2.id
    assert ledger.abort_pending() == 1
    assert ledger.get_call(c1.id).status == "aborted"
    with pytest.raises(InputError, match="3 sampled ids but 2 logprobs"):
        ledger.complete_call(c1.id, sampled_ids=[1, 2, 3], logprobs=[0, 0], finish_reason="stop",
                             summary_hash="s", response_hash="r", response=None)


def test_finish_once_and_survive_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        ro = led.create_rollout("g1")
        led.finish_rollout(ro.id, {"messages": [{"role": "user", "content": "x"}]}, 0.5)
        with pytest.raises(Conflict, match="already finished"):
            led.finish_rollout(ro.id, None, 1.0)
    with Ledger(path, readonly=True) as led:
        back = led.get_rollout(ro.id)
        assert (back.status, back.reward, back.api_key, back.group_id) == ("finished", 0.5, ro.api_key, "g1")
        assert [r.id for r, _ in led.iter_finished()] == [ro.id]
        with pytest.raises(NotFound, match="rollout nope not found"):
            led.get_rollout("nope")
    with pytest.raises(NotFound, match="does not exist"):
        Ledger(tmp_path / "missing.sqlite", readonly=True)


def test_calls_need_an_existing_rollout_and_ordinals_survive_reopen(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        with pytest.raises(NotFound, match="rollout ghost not found"):
            led.begin_call("ghost", parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
        ro = led.create_rollout("g")
        led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
    with Ledger(path) as led:
        again = led.begin_call(ro.id, parent_id=None, prompt_ids=[1], prompt_len=1, request_hash="h")
        assert again.ordinal == 2
