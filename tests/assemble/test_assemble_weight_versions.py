"""Weight versions on rows: the version that sampled each token sits exactly on that token's
position (whatever the loss mask says there), -1 on every token the model did not sample, and
None for a row whose chain holds a call with unknown versions."""

from __future__ import annotations

import numpy as np
from assemble_standin import assistant, write_rollout
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.assemble import build_rows, rollout_rows
from rowgrove.types import Call, Rollout


def user(text):
    return {"role": "user", "content": text}


# c1 ← c2 ← {c3 ← c5, c4}: two accepted leaves sharing the continuation chain c1 ← c2
STEPS = [
    ("c1", None, [1, 2, 3], [101, 102], "a"),
    ("c2", "c1", [4], [103], "b"),
    ("c3", "c2", [5], [104], "left"),
    ("c4", "c2", [6], [105, 106], "right"),
    ("c5", "c3", [7], [107], "left done"),
]
BASE = [user("q"), assistant("a"), user("o"), assistant("b")]
RECORD = {"conversations": [BASE + [user("x"), assistant("left"), user("y"), assistant("left done")],
                            BASE + [user("z"), assistant("right")]]}
VERSIONS = {"c1": [0, 0], "c2": [1], "c3": [2], "c4": [2, 3], "c5": [3]}


def test_versions_sit_on_sampled_positions_of_shared_ancestors_too(ledger):
    rr = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, RECORD, 1.0, versions=VERSIONS))
    assert rr.invalid_reason is None
    first, second = rr.rows
    assert list(first.call_ids) == ["c1", "c2", "c4"]
    assert list(first.input_ids) == [1, 2, 3, 101, 102, 4, 103, 6, 105, 106]
    assert np.asarray(first.weight_versions).dtype == np.int32
    assert list(first.weight_versions) == [-1, -1, -1, 0, 0, -1, 1, -1, 2, 3]
    # the second row trains only c3 and c5, yet c1's and c2's sampled tokens keep their versions
    assert list(second.loss_mask) == [0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]
    assert list(second.weight_versions) == [-1, -1, -1, 0, 0, -1, 1, -1, 2, -1, 3]


def test_a_call_with_unknown_versions_makes_its_rows_unknown_only(ledger):
    known = {k: v for k, v in VERSIONS.items() if k != "c3"}
    first, second = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, RECORD, 1.0, versions=known)).rows
    assert list(first.weight_versions) == [-1, -1, -1, 0, 0, -1, 1, -1, 2, 3]   # c3 is not on this chain
    assert second.weight_versions is None                                       # c3 is
    none = rollout_rows(ledger, write_rollout(ledger, "g", STEPS, RECORD, 1.0, call_prefix="b-")).rows
    assert [r.weight_versions for r in none] == [None, None]


# -- property: any forest of calls, any versions --------------------------------------------

@st.composite
def forests(draw):
    """Calls c1..cn: each a root or a continuation of an earlier call, with random prompt and
    sampled parts and random versions (None for some calls when `unknown` is drawn)."""
    n = draw(st.integers(1, 8))
    unknown = draw(st.sets(st.integers(1, n), max_size=2)) if draw(st.booleans()) else set()
    calls: list[Call] = []
    full: dict[str, int] = {}
    tok = iter(range(1000, 100_000))
    for k in range(1, n + 1):
        parent = draw(st.none() | st.sampled_from([c.id for c in calls])) if calls else None
        prompt = [next(tok) for _ in range(draw(st.integers(1 if parent is None else 0, 4)))]
        sampled = [next(tok) for _ in range(draw(st.integers(1, 4)))]
        versions = draw(st.lists(st.integers(0, 50), min_size=len(sampled), max_size=len(sampled)))
        cid = f"c{k}"
        prompt_len = len(prompt) + (full[parent] if parent else 0)
        full[cid] = prompt_len + len(sampled)
        calls.append(Call(
            id=cid, rollout_id="ro", ordinal=k, parent_id=parent, root=parent is None, status="completed",
            prompt_ids=np.asarray(prompt, np.int32), prompt_len=prompt_len,
            sampled_ids=np.asarray(sampled, np.int32), logprobs=np.full(len(sampled), -0.5, np.float32),
            weight_versions=None if k in unknown else np.asarray(versions, np.int32),
        ))
    return calls


@settings(max_examples=60, deadline=None)
@given(forests())
def test_versions_are_exactly_the_sampled_positions(calls):
    by_id = {c.id: c for c in calls}
    ro = Rollout(id="ro", group_id="g", api_key="k", status="finished", reward=1.0,
                 record={"messages": [user("task")], "accepted_call_ids": [c.id for c in calls]})
    rr = build_rows(ro, calls)
    assert rr.invalid_reason is None and rr.rows
    for row in rr.rows:
        chain = [by_id[i] for i in row.call_ids]
        if any(c.weight_versions is None for c in chain):
            assert row.weight_versions is None
            continue
        # the expected versions, rebuilt from the chain: -1 on each stored prompt part, the call's
        # versions on its sampled part
        want = np.concatenate([np.concatenate([np.full(len(c.prompt_ids), -1), c.weight_versions]) for c in chain])
        got = np.asarray(row.weight_versions)
        assert got.dtype == np.int32 and got.tolist() == want.tolist()
        assert len(got) == len(row.input_ids)
        # every trained token carries a real version; the sampled positions are exactly the >= 0 ones
        mask = np.asarray(row.loss_mask)
        assert (got[mask == 1] >= 0).all()
        sampled = np.concatenate([np.concatenate([np.zeros(len(c.prompt_ids), bool), np.ones(len(c.sampled_ids), bool)])
                                  for c in chain])
        assert ((got >= 0) == sampled).all()
