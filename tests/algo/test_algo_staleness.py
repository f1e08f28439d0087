"""Staleness of a rollout from the weight version on its tokens: a property of the rollout's
trained tokens (never of its rows), and masking that drops whole rollouts, only past the bound."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.algo import mask_stale, staleness
from rowgrove.errors import InputError
from rowgrove.types import Row

CURRENT = 60


@st.composite
def streams(draw):
    """One rollout's tokens as one sequence: (version, mask) per token, version -1 where the
    model sampled nothing; a sampled token may have mask 0 (trained by another row)."""
    n = draw(st.integers(1, 30))
    out = []
    for _ in range(n):
        sampled = draw(st.booleans())
        v = draw(st.integers(0, CURRENT)) if sampled else -1
        out.append((v, int(sampled and draw(st.integers(0, 3)) > 0)))
    return out


def as_rows(rid: str, stream, cuts: list[int]) -> list[Row]:
    """The rollout split into rows at `cuts`: row j holds tokens [0, cut_j) with its mask only on
    [cut_{j-1}, cut_j) (the way a compaction re-sends the prefix as prompt); the last row ends at
    the end. Every row carries the versions of all its positions."""
    v = np.asarray([t[0] for t in stream], np.int32)
    m = np.asarray([t[1] for t in stream], np.int32)
    bounds = sorted(set(c for c in cuts if 0 < c < len(stream))) + [len(stream)]
    rows, lo = [], 0
    for j, hi in enumerate(bounds):
        mask = np.zeros(hi, np.int32)
        mask[lo:hi] = m[lo:hi]
        rows.append(Row(rollout_id=rid, group_id="g", input_ids=np.arange(hi, dtype=np.int32), loss_mask=mask,
                        reward=1.0, segment=j, weight_versions=v[:hi].copy()))
        lo = hi
    return rows


def brute(stream) -> int:
    trained = [v for v, m in stream if m == 1 and v >= 0]
    return CURRENT - min(trained) if trained else 0


batches = st.lists(st.tuples(streams(), st.lists(st.integers(0, 30), max_size=4)), min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(batches, st.randoms(use_true_random=False))
def test_staleness_is_the_oldest_trained_token_whatever_the_rows(batch, rnd):
    whole = [r for i, (s, _) in enumerate(batch) for r in as_rows(f"r{i}", s, [])]
    split = [r for i, (s, cuts) in enumerate(batch) for r in as_rows(f"r{i}", s, cuts)]
    rnd.shuffle(split)
    want = {f"r{i}": brute(s) for i, (s, _) in enumerate(batch)}
    assert staleness(whole, CURRENT) == want
    assert staleness(split, CURRENT) == want
    assert all(type(v) is int for v in want.values())


@settings(max_examples=80, deadline=None)
@given(batches, st.integers(0, CURRENT + 2), st.sets(st.integers(0, 5), max_size=2))
def test_mask_stale_masks_whole_rollouts_past_the_bound_only(batch, bound, unknown_ids):
    rows = []
    for i, (s, cuts) in enumerate(batch):
        rs = as_rows(f"r{i}", s, cuts)
        if i in unknown_ids:   # one row of unknown versions makes the whole rollout unknown
            rs[0].weight_versions = None
        rows.extend(rs)
    before = [(r.valid, r.mask_reason) for r in rows]
    ages = staleness(rows, CURRENT)
    out = mask_stale(rows, CURRENT, bound)
    assert len(out) == len(rows)
    assert [(r.valid, r.mask_reason) for r in rows] == before   # the input is never changed
    for i, (s, _) in enumerate(batch):
        rid = f"r{i}"
        mine = [(a, b) for a, b in zip(rows, out, strict=True) if a.rollout_id == rid]
        if i in unknown_ids:
            assert rid not in ages
            assert all(b is a for a, b in mine)   # unknown staleness: never masked
        elif brute(s) > bound:
            assert all(not b.valid and b.mask_reason == "stale" and b is not a for a, b in mine)
            assert all(np.array_equal(a.loss_mask, b.loss_mask) and a.segment == b.segment for a, b in mine)
        else:
            assert all(b is a and b.valid for a, b in mine)   # within the bound: untouched


def test_worked_example():
    # rollout A: two rows (a compaction), its oldest trained token at version 7; B: one row whose
    # version-2 token is only a prompt token (mask 0), trained tokens at 9; C: nothing trained
    a1 = Row("A", "g", [1, 2, 3], [0, 1, 1], weight_versions=[-1, 8, 9])
    a2 = Row("A", "g", [1, 2, 3, 4, 5], [0, 0, 0, 0, 1], weight_versions=[-1, 8, 9, -1, 7])
    b = Row("B", "g", [1, 2, 3], [0, 0, 1], weight_versions=[-1, 2, 9])
    c = Row("C", "g", [1, 2], [0, 0], weight_versions=[-1, 3])
    d = Row("D", "g", [1, 2], [0, 1])   # versions unknown
    assert staleness([a1, b, a2, c, d], 10) == {"A": 3, "B": 1, "C": 0}
    out = mask_stale([a1, b, a2, c, d], 10, 2)
    assert [(r.rollout_id, r.valid, r.mask_reason) for r in out] == [
        ("A", False, "stale"), ("B", True, None), ("A", False, "stale"), ("C", True, None), ("D", True, None)]
    assert all(r.valid for r in mask_stale([a1, b, a2, c, d], 10, 3))
    # a row already invalid for another reason keeps that reason
    broken = Row("A", "g", [1, 2], [0, 1], valid=False, mask_reason="unmatched_message", weight_versions=[-1, 1])
    assert [r.mask_reason for r in mask_stale([a1, broken], 10, 2)] == ["stale", "unmatched_message"]


def test_refusals_name_the_problem():
    ok = Row("A", "g", [1, 2], [0, 1], weight_versions=[-1, 5])
    with pytest.raises(InputError, match="differ in length.*A"):
        staleness([Row("A", "g", [1, 2], [0, 1], weight_versions=[5])], 9)
    with pytest.raises(InputError, match="newer than current_version 4"):
        staleness([ok], 4)
    for bad in (-1, 1.5, True, None):
        with pytest.raises(InputError, match="max_staleness must be an integer >= 0"):
            mask_stale([ok], 9, bad)
    assert staleness([], 3) == {} and mask_stale([], 3, 0) == []
