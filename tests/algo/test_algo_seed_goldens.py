"""Hand-derived goldens for the seeds' worked examples (000, 002, 004).

Pins user-visible training behaviour: if one of these breaks, what a rollout is worth changed. Do
not "fix" the expected numbers; they are derived by hand in the comments.
"""

import numpy as np
import pytest

from rowgrove.algo import assign_advantages, group_advantages, loss_weights, minibatches
from rowgrove.types import Row


def _row(rollout_id, group_id, n_tokens, n_generated, reward, valid=True):
    # the generated tokens sit at the end of the row, after its prompt
    mask = [0] * (n_tokens - n_generated) + [1] * n_generated
    return Row(rollout_id, group_id, list(range(n_tokens)), mask, reward=reward, valid=valid)


# ---------------------------------------------------------------- seed 000 (NeMo RL #4124)
# One group "q", two rollouts. g0 (reward 1.0) was compacted 3 times: 4 rows of 6, 6, 6, 3 tokens
# with 2, 2, 2, 1 generated (7 in all). g1 (reward 0.0) is one row of 21 tokens, 7 generated.
SEED000 = [
    _row("g0", "q", 6, 2, 1.0),
    _row("g0", "q", 6, 2, 1.0),
    _row("g0", "q", 6, 2, 1.0),
    _row("g0", "q", 3, 1, 1.0),
    _row("g1", "q", 21, 7, 0.0),
]


@pytest.mark.parametrize("kwargs", [{"estimator": "dr_grpo"}, {"estimator": "grpo", "scale_by_std": False}])
def test_seed000_one_reward_per_rollout_gives_plus_minus_half_on_all_five_rows(kwargs):
    # GRPO sees 2 rewards, not 5: [1.0, 0.0] -> baseline (plain mean) 0.5
    # g0: 1.0 - 0.5 = +0.5 on its 4 rows; g1: 0.0 - 0.5 = -0.5 on its 1 row.
    out = assign_advantages(SEED000, **kwargs)
    assert [r.advantage for r in out] == [0.5, 0.5, 0.5, 0.5, -0.5]
    # the row-counting bug would see [1, 1, 1, 1, 0] -> baseline 0.8 -> +0.2 / -0.8
    assert group_advantages([1.0, 1.0, 1.0, 1.0, 0.0], ["q"] * 5, estimator="dr_grpo")[0] == pytest.approx(0.2)
    # new rows, inputs untouched
    assert all(r.advantage is None for r in SEED000)


def test_seed000_token_mean_divides_by_14_generated_tokens_not_by_5_rows():
    # T = 2 + 2 + 2 + 1 + 7 = 14 generated tokens -> each generated token weighs 1/14, prompts 0
    w = loss_weights(SEED000, "token-mean")
    for row, w_T in zip(SEED000, w, strict=True):
        assert len(w_T) == len(row.input_ids)
        np.testing.assert_array_equal(w_T, np.asarray(row.loss_mask) / 14)
    assert sum(w_T.sum() for w_T in w) == pytest.approx(1.0)
    # rollout-mean: R = 2, both rollouts have 7 generated tokens -> 1/(2*7) = 1/14 as well
    w = loss_weights(SEED000, "rollout-mean")
    for row, w_T in zip(SEED000, w, strict=True):
        np.testing.assert_allclose(w_T, np.asarray(row.loss_mask) / 14, rtol=1e-15)


def test_seed000_sequence_level_mode_refuses_split_rollouts():
    # seq-mean-token-mean would give g0's 4 rows 4/5 of the loss: refused (it divides by rows)
    with pytest.raises(ValueError, match=r"several rows \(g0\)"):
        loss_weights(SEED000, "seq-mean-token-mean")


# ---------------------------------------------------------------- seed 002 (agent-lightning Eq. 16)
# Figure 5 batch: rollout A has rows of 50 and 100 tokens, B three rows of 30, C one row of 40;
# every token counts (loss l = 1 per token, all generated).
SEED002 = [
    _row("A", "p", 50, 50, 1.0),
    _row("A", "p", 100, 100, 1.0),
    _row("B", "p", 30, 30, 0.0),
    _row("B", "p", 30, 30, 0.0),
    _row("B", "p", 30, 30, 0.0),
    _row("C", "p", 40, 40, 1.0),
]


def _mass(rows, weights):
    out = {}
    for row, w_T in zip(rows, weights, strict=True):
        out[row.rollout_id] = out.get(row.rollout_id, 0.0) + float(w_T.sum())
    return out


def test_seed002_rollout_mean_gives_each_rollout_one_third():
    # Eq. 16: L = (1/R) sum_rho (sum_j sum_t l) / (sum_j L_rho,j), R = 3 distinct rollouts.
    # A: 150 tokens x 1/(3*150) = 1/3;  B: 90 x 1/(3*90) = 1/3;  C: 40 x 1/(3*40) = 1/3; total 1.
    mass = _mass(SEED002, loss_weights(SEED002, "rollout-mean"))
    assert mass == pytest.approx({"A": 1 / 3, "B": 1 / 3, "C": 1 / 3}, rel=1e-12)
    assert sum(mass.values()) == pytest.approx(1.0, rel=1e-12)
    # the bug divided by T_rollout * N_rows (N = 6): each rollout 1/6, batch total 0.5
    bug = {rid: t / (t * 6) for rid, t in {"A": 150, "B": 90, "C": 40}.items()}
    assert sum(bug.values()) == pytest.approx(0.5)
    assert mass["A"] != pytest.approx(bug["A"])


def test_seed002_token_mean_counts_tokens_and_updates_count_rollouts():
    # token-mean: T = 150 + 90 + 40 = 280 -> A 150/280, B 90/280, C 40/280
    mass = _mass(SEED002, loss_weights(SEED002, "token-mean"))
    assert mass == pytest.approx({"A": 150 / 280, "B": 90 / 280, "C": 40 / 280}, rel=1e-12)
    # the second normalization of the thread (N/R extra updates) cannot happen: 6 rows, 3
    # rollouts, 1 rollout per mini-batch -> ceil(3/1) = 3 updates, not 6
    assert len(minibatches(SEED002, 1)) == 3
    assert len(minibatches(SEED002, 2)) == 2


# ---------------------------------------------------------------- seed 004 (slime #2204)
# Groups of sizes 4, 3, 4; the size-3 group "b" has rewards all 5.0.
#   a = [9, 5, 9, 5]: mean 7, deviations +-2, sample var = (4*4)/3 = 16/3, std = 4/sqrt(3)
#       grpo: +-2 / (4/sqrt(3)) = +-sqrt(3)/2;  dr_grpo: +-2;  rloo: 4/3 * +-2 = +-8/3
#   b = [5, 5, 5]: uniform -> exactly 0 for every estimator
#   c = [8, 4, 8, 4]: mean 6, deviations +-2 -> the same values as a
# The reshape bug fell back to one batch-wide group: mean = (28 + 15 + 24) / 11 = 67/11, so b got
# 5 - 67/11 = -12/11 = -1.090909.
SEED004_REWARDS = [9, 5, 5, 8, 9, 5, 4, 5, 8, 5, 4]
SEED004_GROUPS = ["a", "a", "b", "c", "a", "b", "c", "a", "c", "b", "c"]  # interleaved on purpose
SIGN = np.array([1, -1, 0, 1, 1, 0, -1, -1, 1, 0, -1], dtype=float)


@pytest.mark.parametrize(
    ("estimator", "magnitude"), [("grpo", np.sqrt(3) / 2), ("dr_grpo", 2.0), ("rloo", 8 / 3)]
)
def test_seed004_uniform_group_gets_exactly_zero(estimator, magnitude):
    adv = group_advantages(SEED004_REWARDS, SEED004_GROUPS, estimator=estimator, eps=0.0)
    assert adv[[2, 5, 9]].tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(adv, SIGN * magnitude, rtol=1e-12)


def test_seed004_batch_wide_fallback_reproduces_the_bug_value():
    # what view(-1, total) computed: one group of all 11 -> b gets -12/11
    bug = group_advantages(SEED004_REWARDS, ["all"] * 11, estimator="dr_grpo")
    assert bug[2] == pytest.approx(-12 / 11, rel=1e-12)
    assert round(bug[2], 6) == -1.090909
    # and grpo with the default eps keeps b at exactly 0 too
    assert group_advantages(SEED004_REWARDS, SEED004_GROUPS)[[2, 5, 9]].tolist() == [0.0] * 3
