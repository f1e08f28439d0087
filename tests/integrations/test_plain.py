"""The plain shapes of slime, SkyRL and prime-rl (dicts with their field names), checked by hand
on one group: rollout a (reward 1) compacted into 2 rows, rollout b (reward 0) in one row.

grpo over rollouts: rewards [1, 0], mean 1/2, sample std sqrt(1/2): A = +-0.5/sqrt(1/2) = +-0.70711.
slime's default post-processing on these 3 samples (rewards per sample [1, 1, 0], reshaped into
one group) would give mean 2/3: a's samples +1/3 twice, b -2/3 (before std), counting a twice.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from rowgrove.errors import InputError
from rowgrove.integrations.plain import (
    rows_to_prime_samples,
    rows_to_skyrl_output,
    rows_to_slime_samples,
    slime_reward_post_process,
)
from rowgrove.types import Row

A = 0.5 / math.sqrt(0.5) * (1 / (1 + 1e-6 / math.sqrt(0.5)))  # (r - mean) / (std + 1e-6)


def rows() -> list[Row]:
    return [
        Row("ro-a", "q", [1, 2, 3, 4], [0, 1, 1, 0], reward=1.0, logprobs=[0, -0.5, -0.5, 0]),
        Row("ro-b", "q", [1, 2, 7], [0, 0, 1], reward=0.0, logprobs=[0, 0, -1.0]),
        Row("ro-a", "q", [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 1], reward=1.0, logprobs=[0, -0.5, -0.5, 0, -0.1, -0.2],
            segment=1),
        Row("ro-c", "q", [1, 9], [0, 1], reward=1.0, valid=False, mask_reason="engine_error", logprobs=[0, -1.0]),
    ]


def test_slime_samples_carry_rollout_ids_and_response_fields():
    s = rows_to_slime_samples(rows())
    assert [x["metadata"]["rowgrove_rollout_id"] for x in s] == ["ro-a", "ro-a", "ro-b"]  # rollout's rows adjacent
    assert [x["rollout_id"] for x in s] == [0, 0, 1] and [x["group_index"] for x in s] == [0, 0, 0]
    assert [x["index"] for x in s] == [0, 1, 2]
    assert s[0]["tokens"] == [1, 2, 3, 4] and s[0]["response_length"] == 3
    assert s[0]["loss_mask"] == [1, 1, 0] and s[0]["rollout_log_probs"] == [-0.5, -0.5, 0.0]
    assert s[1]["response_length"] == 2 and s[1]["loss_mask"] == [1, 1]
    assert s[2]["tokens"] == [1, 2, 7] and s[2]["response_length"] == 1 and s[2]["reward"] == 0.0
    for x in s:
        assert len(x["loss_mask"]) == len(x["rollout_log_probs"]) == x["response_length"]


def test_slime_reward_hook_counts_a_rollout_once():
    s = rows_to_slime_samples(rows())
    raw, adv = slime_reward_post_process(SimpleNamespace(advantage_estimator="grpo", grpo_std_normalization=True), s)
    assert raw == [1.0, 1.0, 0.0]
    assert adv == pytest.approx([A, A, -A], rel=1e-12)
    _, dr = slime_reward_post_process(SimpleNamespace(advantage_estimator="dr_grpo"), s)
    assert dr == pytest.approx([0.5, 0.5, -0.5])
    # works on objects with attributes too (slime's Sample)
    objs = [SimpleNamespace(**x) for x in s]
    assert slime_reward_post_process(SimpleNamespace(advantage_estimator="rloo"), objs)[1] == pytest.approx([1, 1, -1])


def test_slime_reward_hook_refuses_siblings_that_disagree_and_missing_ids():
    s = rows_to_slime_samples(rows())
    s[1]["reward"] = 0.5
    with pytest.raises(InputError, match="disagree on reward"):
        slime_reward_post_process(SimpleNamespace(advantage_estimator="grpo"), s)
    s = rows_to_slime_samples(rows())
    s[0]["rollout_id"] = None
    with pytest.raises(InputError, match="no rollout_id"):
        slime_reward_post_process(SimpleNamespace(advantage_estimator="grpo"), s)


def test_skyrl_step_wise_output_marks_last_steps_and_trajectory_ids():
    out = rows_to_skyrl_output(rows())
    assert out["is_last_step"] == [False, True, True]
    assert out["trajectory_ids"] == [{"instance_id": "q", "repetition_id": 0}, {"instance_id": "q", "repetition_id": 0},
                                     {"instance_id": "q", "repetition_id": 1}]
    assert out["prompt_token_ids"] == [[1], [1, 2, 3, 4], [1, 2]]
    assert out["response_ids"] == [[2, 3, 4], [5, 6], [7]]
    assert out["loss_masks"] == [[1, 1, 0], [1, 1], [1]]
    assert out["rollout_logprobs"] == [[-0.5, -0.5, 0.0], pytest.approx([-0.1, -0.2]), [-1.0]]
    assert out["rewards"] == [1.0, 1.0, 0.0]
    # SkyRL computes the advantage on last steps only: one reward per rollout
    last = [r for r, last in zip(out["rewards"], out["is_last_step"], strict=True) if last]
    assert last == [1.0, 0.0]


@pytest.mark.parametrize(("mode", "weights"), [
    # token-mean: T = 5 generated tokens, w = 1/5, rl weight = w * T = 1
    ("token-mean", [[0, 1, 1, 0], [0, 0, 1], [0, 0, 0, 0, 1, 1]]),
    # rollout-mean: R = 2; a has 4 tokens, w = 1/8, x 5 = 0.625; b has 1, w = 1/2, x 5 = 2.5
    ("rollout-mean", [[0, 0.625, 0.625, 0], [0, 0, 2.5], [0, 0, 0, 0, 0.625, 0.625]]),
])
def test_prime_rl_samples_carry_rowgroves_weights_times_the_token_count(mode, weights):
    s = rows_to_prime_samples(rows(), env_name="counter", loss_mode=mode)
    assert [x["rl_weights"] for x in s] == [pytest.approx(w) for w in weights]
    # input order; the invalid rollout ro-c is left out
    assert [x["mask"] for x in s] == [[False, True, True, False], [False, False, True],
                                      [False, False, False, False, True, True]]
    assert s[0]["advantages"] == pytest.approx([A] * 4) and s[1]["advantages"] == pytest.approx([-A] * 3)
    assert all(x["env_name"] == "counter" and x["temperatures"] == [1.0] * len(x["token_ids"]) for x in s)
    # prime-rl divides its rl component by the count of tokens with a nonzero weight (5)
    total = sum(sum(x["rl_weights"]) for x in s)
    assert total / 5 == pytest.approx(1.0)


def test_nothing_in_the_core_imports_the_integrations():
    """The adapters are optional extras: no module outside rowgrove.integrations imports them."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "rowgrove"
    offenders = [str(p.relative_to(src)) for p in src.rglob("*.py")
                 if "integrations" not in p.parts and "rowgrove.integrations" in p.read_text()]
    assert offenders == []
