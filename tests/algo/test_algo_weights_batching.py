"""loss_weights and minibatches: masses, masks, refusals, determinism."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.algo import MODES, loss_weights, minibatches
from rowgrove.errors import InputError
from rowgrove.types import Row

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def batches(draw, max_rows_per_rollout=3):
    """Rows of a few rollouts, some split, some invalid, masks random: list[Row]."""
    rows = []
    for r in range(draw(st.integers(1, 6))):
        valid = draw(st.booleans()) or draw(st.booleans())
        for _ in range(draw(st.integers(1, max_rows_per_rollout))):
            mask = draw(st.lists(st.integers(0, 1), min_size=0, max_size=8))
            rows.append(Row(f"r{r}", "p", list(range(len(mask))), mask, reward=0.0, valid=valid))
    return draw(st.permutations(rows))


def _generated(rows):
    invalid = {r.rollout_id for r in rows if not r.valid}
    return sum(sum(r.loss_mask) for r in rows if r.rollout_id not in invalid)


@SETTINGS
@given(batches(), st.sampled_from(["token-mean", "rollout-mean"]))
def test_weights_sum_to_one_and_vanish_off_the_mask_and_on_invalid_rollouts(rows, mode):
    w = loss_weights(rows, mode)
    invalid = {r.rollout_id for r in rows if not r.valid}
    total = 0.0
    for row, w_T in zip(rows, w, strict=True):
        assert w_T.shape == (len(row.input_ids),) and np.isfinite(w_T).all()
        assert (w_T[np.asarray(row.loss_mask, dtype=int) == 0] == 0).all()
        if row.rollout_id in invalid:
            assert (w_T == 0).all()
        total += w_T.sum()
    assert total == pytest.approx(1.0 if _generated(rows) else 0.0, abs=1e-12)


@SETTINGS
@given(batches())
def test_rollout_mean_gives_every_live_rollout_the_same_mass(rows):
    mass = {}
    for row, w_T in zip(rows, loss_weights(rows, "rollout-mean"), strict=True):
        mass[row.rollout_id] = mass.get(row.rollout_id, 0.0) + w_T.sum()
    live = [m for m in mass.values() if m > 0]
    assert all(m == pytest.approx(1 / len(live), rel=1e-12) for m in live)


def test_token_mean_weighs_each_generated_token_1_over_T():
    rows = [Row("a", "p", [1, 2, 3, 4], [0, 1, 1, 0]), Row("b", "p", [1, 2], [0, 1]),
            Row("c", "p", [5, 6, 7], [0, 1, 1], valid=False)]
    w = loss_weights(rows)  # T = 2 + 1 (c is invalid) -> 1/3
    assert [x.tolist() for x in w] == [[0, 1 / 3, 1 / 3, 0], [0, 1 / 3], [0, 0, 0]]


def test_seq_mean_token_mean_on_single_row_rollouts():
    rows = [Row("a", "p", [1, 2, 3, 4], [0, 1, 1, 1]), Row("b", "p", [1, 2], [0, 1]), Row("c", "p", [1], [0])]
    w = loss_weights(rows, "seq-mean-token-mean")  # N = 2 rows with generated tokens
    np.testing.assert_allclose(w[0], [0, 1 / 6, 1 / 6, 1 / 6])
    np.testing.assert_allclose(w[1], [0, 1 / 2])
    assert w[2].tolist() == [0.0]


@pytest.mark.parametrize("mode", MODES)
def test_no_generated_tokens_gives_zero_weights_not_nan(mode):
    w = loss_weights([Row("a", "p", [1, 2], [0, 0]), Row("b", "p", [3], [1], valid=False)], mode)
    assert [x.tolist() for x in w] == [[0.0, 0.0], [0.0]]
    assert loss_weights([], mode) == []


def test_loss_weights_refusals():
    with pytest.raises(InputError, match="unknown loss mode 'seq-mean': use one of token-mean, rollout-mean"):
        loss_weights([], "seq-mean")
    with pytest.raises(InputError, match=r"differ in length on rows of 1 rollouts \(a\)"):
        loss_weights([Row("a", "p", [1, 2, 3], [0, 1])])


# ---------------------------------------------------------------- minibatches


@SETTINGS
@given(batches(max_rows_per_rollout=4), st.integers(1, 4), st.integers(0, 3))
def test_minibatches_cut_whole_rollouts_and_keep_row_order(rows, k, seed):
    mbs = minibatches(rows, k, seed=seed)
    n_rollouts = len({r.rollout_id for r in rows})
    assert len(mbs) == -(-n_rollouts // k)
    seen = {}
    for j, mb in enumerate(mbs):
        ids = {r.rollout_id for r in mb}
        assert 1 <= len(ids) <= k
        for rid in ids:
            assert seen.setdefault(rid, j) == j  # all rows of a rollout in one mini-batch
        positions = [next(i for i, r in enumerate(rows) if r is x) for x in mb]
        assert positions == sorted(positions)
    assert sum(len(mb) for mb in mbs) == len(rows)
    # deterministic, and independent of row order / row count
    assert [[id(r) for r in mb] for mb in minibatches(rows, k, seed=seed)] == [[id(r) for r in mb] for mb in mbs]
    merged = [Row(rid, "p", [0], [1]) for rid in sorted({r.rollout_id for r in rows}, reverse=True)]
    assert [{r.rollout_id for r in mb} for mb in minibatches(merged, k, seed=seed)] == [
        {r.rollout_id for r in mb} for mb in mbs
    ]


def test_minibatches_refusals_and_empty():
    with pytest.raises(InputError, match="positive int"):
        minibatches([], 1.5)
    with pytest.raises(InputError, match="at least 1"):
        minibatches([], 0)
    assert minibatches([], 3) == []
