"""Global divisors: a mini-batch dealt to ranks in any way, each rank weighting its share with the
summed counts, gets exactly the weights of the whole mini-batch in one process."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.algo import RolloutCounts, loss_weights, rollout_counts, split_across_ranks
from rowgrove.errors import InputError
from rowgrove.types import Row

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def dealt(draw):
    """(rows of a few rollouts, some split and some invalid, a rank per row, n_ranks)."""
    rows = []
    for r in range(draw(st.integers(1, 6))):
        valid = draw(st.booleans()) or draw(st.booleans())
        for _ in range(draw(st.integers(1, 3))):
            mask = draw(st.lists(st.integers(0, 1), min_size=0, max_size=8))
            rows.append(Row(f"r{r}", "p", list(range(len(mask))), mask, reward=0.0, valid=valid))
    n_ranks = draw(st.integers(1, 4))
    ranks = draw(st.lists(st.integers(0, n_ranks - 1), min_size=len(rows), max_size=len(rows)))
    return rows, ranks, n_ranks


def _by_rank(rows, ranks, n_ranks):
    return [[(i, row) for i, (row, k) in enumerate(zip(rows, ranks, strict=True)) if k == rank]
            for rank in range(n_ranks)]


@SETTINGS
@given(dealt(), st.sampled_from(["token-mean", "rollout-mean"]))
def test_shares_weighted_with_summed_counts_equal_the_whole(case, mode):
    rows, ranks, n_ranks = case
    whole = loss_weights(rows, mode)
    ids = sorted({r.rollout_id for r in rows})
    shares = _by_rank(rows, ranks, n_ranks)
    summed = sum(rollout_counts([row for _, row in share], ids).as_array() for share in shares)
    counts = RolloutCounts.from_array(ids, summed)
    got = {}
    for share in shares:
        for (i, _), w in zip(share, loss_weights([row for _, row in share], mode, counts=counts), strict=True):
            got[i] = w
    for i, w in enumerate(whole):
        np.testing.assert_array_equal(got[i], w)  # same counts, same arithmetic: bit-identical


def test_a_rollout_invalid_on_one_rank_is_masked_on_every_rank():
    # r0's rows disagree on validity across ranks: the rollout is invalid whole (min over rows)
    a, b = Row("r0", "p", [1, 2], [0, 1]), Row("r0", "p", [1, 2, 3], [0, 1, 1], valid=False)
    c = Row("r1", "p", [1, 2], [0, 1])
    counts = RolloutCounts.from_array(["r0", "r1"], rollout_counts([a, c], ["r0", "r1"]).as_array()
                                      + rollout_counts([b], ["r0", "r1"]).as_array())
    wa, wc = loss_weights([a, c], "token-mean", counts=counts)
    assert wa.tolist() == [0.0, 0.0] and wc.tolist() == [0.0, 1.0]  # T = 1: only r1's token


def test_seq_mean_refuses_a_rollout_split_across_ranks():
    a, b = Row("r0", "p", [1, 2], [0, 1]), Row("r0", "p", [1, 2, 3], [0, 0, 1])
    counts = RolloutCounts.from_array(["r0"], rollout_counts([a]).as_array() + rollout_counts([b]).as_array())
    loss_weights([a], "seq-mean-token-mean")  # alone it looks unsplit
    with pytest.raises(InputError, match="rollouts have several rows"):
        loss_weights([a], "seq-mean-token-mean", counts=counts)


def test_counts_must_cover_the_rows():
    with pytest.raises(InputError, match="not among"):
        rollout_counts([Row("r9", "p", [1], [0])], ["r0"])
    with pytest.raises(InputError, match="do not cover"):
        loss_weights([Row("r9", "p", [1], [0])], counts=rollout_counts([], ["r0"]))
    with pytest.raises(InputError, match="shape"):
        RolloutCounts.from_array(["r0"], np.zeros((3, 2)))


@SETTINGS
@given(st.lists(st.integers(1, 30), min_size=0, max_size=20), st.integers(1, 5))
def test_split_across_ranks_deals_every_row_once_in_order_and_balances(lengths, n_ranks):
    rows = [Row(f"r{i % 4}", "p", list(range(n)), [0] * n) for i, n in enumerate(lengths)]
    shares = split_across_ranks(rows, n_ranks)
    assert len(shares) == n_ranks
    flat = [id(r) for share in shares for r in share]
    assert sorted(flat) == sorted(id(r) for r in rows)
    for share in shares:  # input order inside a rank
        pos = [next(i for i, r in enumerate(rows) if r is x) for x in share]
        assert pos == sorted(pos)
    loads = [sum(len(r.input_ids) for r in share) for share in shares]
    if rows:  # greedy longest-first: no rank exceeds another by more than the longest row
        assert max(loads) - min(loads) <= max(lengths)


def test_split_across_ranks_golden():
    rows = [Row("a", "p", [0] * 5, [0] * 5), Row("a", "p", [0] * 9, [0] * 9), Row("b", "p", [0] * 4, [0] * 4),
            Row("c", "p", [0] * 3, [0] * 3)]
    # 9 -> rank 0; 5 -> rank 1; 4 -> rank 1 (5 < 9); 3 -> rank 0 (9 = 9, lowest rank)
    shares = split_across_ranks(rows, 2)
    assert [[len(r.input_ids) for r in s] for s in shares] == [[9, 3], [5, 4]]
    with pytest.raises(InputError, match="n_ranks"):
        split_across_ranks(rows, 0)
