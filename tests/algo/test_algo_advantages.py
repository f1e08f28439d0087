"""group_advantages and assign_advantages: properties, vectorized == loop, and the errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.algo import ESTIMATORS, assign_advantages, group_advantages
from rowgrove.errors import InputError, RowgroveError
from rowgrove.types import Row

SETTINGS = settings(max_examples=50, deadline=None)

rewards_st = st.floats(-100, 100, allow_nan=False, allow_infinity=False)


@st.composite
def grouped(draw, min_size=1):
    """Uneven groups in shuffled order: (rewards, group ids)."""
    sizes = draw(st.lists(st.integers(1, 6), min_size=min_size, max_size=8))
    ids = [g for g, n in enumerate(sizes) for _ in range(n)]
    rewards = draw(st.lists(rewards_st, min_size=len(ids), max_size=len(ids)))
    perm = draw(st.permutations(range(len(ids))))
    as_str = draw(st.booleans())
    gids = [f"p{ids[i]}" if as_str else ids[i] for i in perm]
    return [rewards[i] for i in perm], gids


def loop_advantages(rewards, group_ids, estimator, scale_by_std=True, eps=1e-6):
    """The plain per-group loop the kernel must equal."""
    members = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        r = [rewards[i] for i in idx]
        n = len(r)
        if n < 2 or all(x == r[0] for x in r):
            continue
        mean = sum(r) / n
        for i in idx:
            if estimator == "rloo":
                out[i] = rewards[i] - (sum(r) - rewards[i]) / (n - 1)
            elif estimator == "grpo" and scale_by_std:
                std = math.sqrt(sum((x - mean) ** 2 for x in r) / (n - 1))
                out[i] = (rewards[i] - mean) / (std + eps)
            else:
                out[i] = rewards[i] - mean
    return np.array(out)


@SETTINGS
@given(grouped(), st.sampled_from(ESTIMATORS), st.booleans())
def test_vectorized_equals_per_group_loop(data, estimator, scale):
    rewards, gids = data
    got = group_advantages(rewards, gids, estimator=estimator, scale_by_std=scale)
    np.testing.assert_allclose(got, loop_advantages(rewards, gids, estimator, scale), rtol=1e-7, atol=1e-7)
    # numpy id arrays (int or str) take other factorization paths and give the same answer
    np.testing.assert_array_equal(got, group_advantages(rewards, np.asarray(gids), estimator=estimator, scale_by_std=scale))


@SETTINGS
@given(grouped(), st.sampled_from(ESTIMATORS))
def test_advantages_sum_to_zero_per_group(data, estimator):
    rewards, gids = data
    adv = group_advantages(rewards, gids, estimator=estimator)
    for g in set(gids):
        members = [i for i, x in enumerate(gids) if x == g]
        scale = max(1.0, max(abs(adv[i]) for i in members))
        assert abs(sum(adv[i] for i in members)) <= 1e-9 * scale * len(members)


@SETTINGS
@given(grouped(), st.sampled_from(ESTIMATORS), st.randoms(use_true_random=False))
def test_permuting_the_input_permutes_the_output(data, estimator, rnd):
    rewards, gids = data
    perm = list(range(len(rewards)))
    rnd.shuffle(perm)
    adv = group_advantages(rewards, gids, estimator=estimator)
    adv_p = group_advantages([rewards[i] for i in perm], [gids[i] for i in perm], estimator=estimator)
    np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-12, atol=1e-12)


@SETTINGS
@given(rewards_st, st.integers(1, 9), st.sampled_from(ESTIMATORS), st.sampled_from([0.0, 1e-6]))
def test_uniform_group_and_group_of_one_are_exactly_zero(value, n, estimator, eps):
    adv = group_advantages([value] * n + [value + 1.0, value - 1.0, 3.0], ["u"] * n + ["v", "v", "solo"],
                           estimator=estimator, eps=eps)
    assert adv[:n].tolist() == [0.0] * n  # uniform group: exactly 0, even with eps = 0
    assert adv[-1] == 0.0  # group of one: 0, never NaN
    assert np.isfinite(adv).all()


@SETTINGS
@given(st.lists(st.booleans(), min_size=2, max_size=20).filter(lambda m: any(m) and not all(m)))
def test_partial_group_ids_raise_naming_how_many_and_which(missing):
    gids = [None if m else "p" for m in missing]
    where = [i for i, m in enumerate(missing) if m]
    with pytest.raises(InputError) as e:
        group_advantages([0.0] * len(gids), gids)
    msg = str(e.value)
    assert f"missing for {len(where)} of {len(gids)} rollouts" in msg
    assert f"positions {where[0]}" in msg
    assert isinstance(e.value, RowgroveError) and isinstance(e.value, ValueError)


def test_all_ids_missing_needs_an_explicit_contiguous_group_size():
    with pytest.raises(InputError, match="missing for all 4 rollouts"):
        group_advantages([1, 0, 1, 1], [None] * 4)
    with pytest.raises(InputError, match="group_size"):
        group_advantages([1, 0, 1, 1], None)
    # contiguous groups of 2: [1, 0] -> +-0.5, [1, 1] -> 0
    np.testing.assert_array_equal(
        group_advantages([1, 0, 1, 1], None, group_size=2, estimator="dr_grpo"), [0.5, -0.5, 0, 0]
    )
    with pytest.raises(InputError, match="contiguous groups of 3"):
        group_advantages([1, 0, 1, 1], [None] * 4, group_size=3)
    with pytest.raises(InputError, match="not both"):
        group_advantages([1, 0], ["p", "p"], group_size=2)


def test_bad_inputs_name_the_problem():
    with pytest.raises(InputError, match=r"unknown estimator 'ppo': use one of grpo, dr_grpo, rloo"):
        group_advantages([1.0], ["p"], estimator="ppo")
    with pytest.raises(InputError, match=r"not finite for 2 of 3 rollouts \(positions 0, 2\)"):
        group_advantages([math.nan, 1.0, math.inf], ["p", "p", "p"])
    with pytest.raises(InputError, match="3 rewards but 2 group ids"):
        group_advantages([1.0, 2.0, 3.0], ["p", "p"])
    assert group_advantages([], []).shape == (0,)


def test_wide_integer_ids_take_the_sorting_path_and_agree():
    rewards = [1.0, 0.0, 3.0, 5.0, 2.0]
    wide = np.array([10**15, 7, 10**15, 7, -(10**12)])
    dense = np.array([0, 1, 0, 1, 2])
    np.testing.assert_array_equal(group_advantages(rewards, wide), group_advantages(rewards, dense))


# ---------------------------------------------------------------- assign_advantages


def row(rid, gid, reward, valid=True, n=3, reason=None):
    return Row(rid, gid, [1] * n, [0] + [1] * (n - 1), reward=reward, valid=valid, mask_reason=reason)


def test_assign_copies_one_advantage_per_rollout_and_keeps_order():
    rows = [row("a", "p", 1.0), row("b", "p", 0.0), row("a", "p", 1.0), row("c", "q", 2.0)]
    out = assign_advantages(rows, estimator="dr_grpo")
    assert [r.rollout_id for r in out] == ["a", "b", "a", "c"]
    assert [r.advantage for r in out] == [0.5, -0.5, 0.5, 0.0]  # c is alone in q
    assert out[0] is not rows[0] and rows[0].advantage is None


def test_invalid_rollout_is_masked_whole_and_left_out_of_the_baseline():
    rows = [
        row("a", "p", 1.0), row("b", "p", 0.0),
        row("c", "p", 100.0), row("c", "p", 100.0, valid=False, reason="no call produced this text"),
        row("d", "p", None, valid=False, reason="harness crashed"),
    ]
    out = assign_advantages(rows, estimator="dr_grpo")
    # baseline over a and b only: mean 0.5 (with c it would be 33.67)
    assert [r.advantage for r in out] == [0.5, -0.5, 0.0, 0.0, 0.0]
    assert [r.valid for r in out] == [True, True, False, False, False]
    # the sibling row of c inherits c's reason; own reasons are kept
    assert [r.mask_reason for r in out[2:]] == ["no call produced this text"] * 2 + ["harness crashed"]


def test_group_with_one_valid_member_gets_zero():
    out = assign_advantages([row("a", "p", 1.0), row("b", "p", 0.0, valid=False)])
    assert [r.advantage for r in out] == [0.0, 0.0]


@pytest.mark.parametrize(
    ("rows", "pattern"),
    [
        ([row("a", "p", 1.0), row("a", "p", 0.5)], r"disagree on the reward \(a: 0.5 vs 1.0\)"),
        ([row("a", "p", 1.0), row("a", "q", 1.0)], r"disagree on the group_id \(a: 'p' vs 'q'\)"),
        ([row("a", "p", None), row("b", "p", 1.0)], r"reward missing for 1 valid rollouts \(a\)"),
        ([row("a", "p", math.nan), row("b", "p", 1.0)], r"not finite for 1 valid rollouts \(a\)"),
        ([row("a", "p", 1.0), row("b", None, 1.0), row("c", None, 0.0)],
         r"group_id missing for 2 of 3 valid rollouts \(b, c\)"),
        ([row("a", None, 1.0)], r"group_id missing for 1 of 1 valid rollouts \(a\)"),
    ],
)
def test_assign_refuses_inconsistent_rollouts(rows, pattern):
    with pytest.raises(InputError, match=pattern):
        assign_advantages(rows)


def test_assign_unknown_estimator():
    with pytest.raises(InputError, match="unknown estimator"):
        assign_advantages([row("a", "p", 1.0)], estimator="mean")


def test_str_ids_survive_a_hash_collision(monkeypatch):
    # the str path groups by hash and then checks exactly; force every hash to collide
    import rowgrove.algo.advantages as adv_mod

    rewards, gids = [1.0, 0.0, 3.0, 5.0, 2.0, 2.0], ["a", "b", "a", "b", "c", "b"]
    expected = group_advantages(rewards, gids)
    monkeypatch.setattr(adv_mod, "hash", lambda _: 7, raising=False)
    np.testing.assert_array_equal(group_advantages(rewards, gids), expected)
    assert expected[4] == 0.0 and expected[0] == -expected[2]


def test_mixed_and_unhashable_ids():
    np.testing.assert_array_equal(group_advantages([1.0, 0.0, 2.0], ["1", 1, "1"], estimator="dr_grpo"),
                                  [-0.5, 0.0, 0.5])
    with pytest.raises(InputError, match="hashable"):
        group_advantages([1.0, 0.0], [["p"], ["p"]])
