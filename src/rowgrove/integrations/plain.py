"""rowgrove rows in the plain shapes of trainers that are not installable here: slime's `Sample`,
SkyRL's `GeneratorOutput` and prime-rl's `TrainingSample`, as dicts with their field names (read
from their code: THUDM/slime `slime/utils/types.py`, NovaSky-AI/SkyRL
`skyrl/train/generators/base.py`, PrimeIntellect-ai/prime-rl
`src/prime_rl/transports/rollouts/types.py`). Build the real object with `Sample(**d)`,
`TrainingSample(**d)`; SkyRL's GeneratorOutput is a TypedDict, so the dict is the object
(trajectory ids as `TrajectoryID(**t)`).

No math is done here beyond calling `rowgrove.algo`: advantages per rollout by explicit group,
loss weights that do not depend on row counts. What each trainer then does with them is in
docs/integrations.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rowgrove.algo import group_advantages
from rowgrove.errors import InputError, name_some
from rowgrove.integrations.weighting import weigh_rows
from rowgrove.types import Row


def _rollouts_adjacent(weighted: list[Any]) -> list[Any]:
    """The rows with each rollout's rows adjacent, rollouts in order of first appearance."""
    first: dict[str, int] = {}
    for i, w in enumerate(weighted):
        first.setdefault(w.row.rollout_id, i)
    return [weighted[i] for i in sorted(range(len(weighted)), key=lambda i: (first[weighted[i].row.rollout_id], i))]


def _codes(values: Sequence[Any]) -> list[int]:
    """Dense int codes in order of first appearance (slime's ids are ints)."""
    index: dict[Any, int] = {}
    return [index.setdefault(v, len(index)) for v in values]


def rows_to_slime_samples(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """One slime `Sample` (as a dict of its fields) per row of a valid rollout, rows of a rollout
    adjacent: `tokens` (the whole row), `response_length` (tokens from the first generated one
    on), `loss_mask` and `rollout_log_probs` over the response, `reward` (the rollout's, on every
    row), `group_index` (the group, as an int), `rollout_id` (the rollout, as an int: slime counts
    siblings with one rollout_id once in its loss reducer), `index` (the row's position), and
    `metadata` with rowgrove's string ids. Invalid rollouts and rows without a generated token are
    left out (their weight is 0)."""
    kept = _rollouts_adjacent(weigh_rows(rows, loss_mode="token-mean").rows)
    groups = _codes([w.row.group_id for w in kept])
    rollouts = _codes([w.row.rollout_id for w in kept])
    out = []
    for i, (w, g, r) in enumerate(zip(kept, groups, rollouts, strict=True)):
        s = w.start
        out.append({
            "group_index": g, "index": i, "rollout_id": r,
            "tokens": [int(x) for x in w.row.input_ids],
            "response_length": len(w.row.input_ids) - s,
            "loss_mask": [int(x != 0) for x in np.asarray(w.row.loss_mask)[s:]],
            "rollout_log_probs": [float(x) for x in np.asarray(w.row.logprobs)[s:]],
            "reward": float(w.row.reward),
            "metadata": {"rowgrove_rollout_id": w.row.rollout_id, "rowgrove_group_id": w.row.group_id},
        })
    return out


def _field(sample: Any, name: str) -> Any:
    return sample[name] if isinstance(sample, dict) else getattr(sample, name)


def slime_reward_post_process(args: Any, samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """slime's `--custom-reward-post-process-path` hook: `(raw_rewards, advantages)`, one entry per
    sample. slime's default reshapes the per-sample rewards by `n_samples_per_prompt` (one batch-wide
    group when the count differs: slime PR #2204) and counts a rollout once per sample. Here the
    rollouts are told apart by `rollout_id` (siblings must agree on the reward), grouped by
    `group_index`, and `rowgrove.algo.group_advantages` gives one advantage per rollout, copied
    onto its samples. `args.advantage_estimator` "grpo" (with `args.grpo_std_normalization`),
    "dr_grpo" or "rloo"; other estimators raise. Samples may be slime Samples or dicts."""
    name = getattr(args, "advantage_estimator", "grpo")
    if name not in ("grpo", "dr_grpo", "rloo"):
        raise InputError(f"slime_reward_post_process computes grpo, dr_grpo or rloo advantages, not {name!r}")
    scale = bool(getattr(args, "grpo_std_normalization", True))
    rewards = [float(_field(s, "reward")) for s in samples]
    rids = [_field(s, "rollout_id") for s in samples]
    missing = [i for i, r in enumerate(rids) if r is None]
    if missing:
        raise InputError(f"{len(missing)} samples have no rollout_id (positions {name_some(missing)}): give every "
                         "sample of one rollout the same rollout_id")
    first: dict[Any, int] = {}
    bad = []
    for i, rid in enumerate(rids):
        k = first.setdefault(rid, i)
        if rewards[k] != rewards[i] or _field(samples[k], "group_index") != _field(samples[i], "group_index"):
            bad.append(rid)
    if bad:
        raise InputError(f"samples of rollouts {name_some(sorted(set(bad), key=str))} disagree on reward or "
                         "group_index: a rollout has one reward and one group")
    heads = list(first.values())
    adv_R = group_advantages([rewards[i] for i in heads], [_field(samples[i], "group_index") for i in heads],
                             estimator=name, scale_by_std=scale)
    by_rollout = {rids[i]: float(a) for i, a in zip(heads, adv_R.tolist(), strict=True)}
    return rewards, [by_rollout[r] for r in rids]


def rows_to_skyrl_output(rows: Sequence[Row], *, stop_reason: str = "stop") -> dict[str, Any]:
    """A SkyRL `GeneratorOutput` for step-wise training (`generator.step_wise_trajectories=true`):
    one entry per row, the rows of a rollout adjacent and `is_last_step` true on the last of them
    (SkyRL computes GRPO advantages on last steps only and broadcasts them to the trajectory's
    steps, so a rollout's reward is counted once). `trajectory_ids` are dicts for
    `TrajectoryID(instance_id=group id, repetition_id=k)`: the k-th rollout of that group.
    `prompt_token_ids` / `response_ids` split each row at its first generated token; `loss_masks`
    and `rollout_logprobs` cover the response; `rewards` holds the rollout's reward per row."""
    kept = _rollouts_adjacent(weigh_rows(rows, loss_mode="token-mean").rows)
    rep: dict[str, dict[str, int]] = {}
    out: dict[str, Any] = {k: [] for k in ("prompt_token_ids", "response_ids", "rewards", "loss_masks",
                                           "stop_reasons", "rollout_logprobs", "trajectory_ids", "is_last_step")}
    for i, w in enumerate(kept):
        s, row = w.start, w.row
        reps = rep.setdefault(str(row.group_id), {})
        k = reps.setdefault(row.rollout_id, len(reps))
        out["prompt_token_ids"].append([int(x) for x in np.asarray(row.input_ids)[:s]])
        out["response_ids"].append([int(x) for x in np.asarray(row.input_ids)[s:]])
        out["rewards"].append(float(row.reward))
        out["loss_masks"].append([int(x != 0) for x in np.asarray(row.loss_mask)[s:]])
        out["stop_reasons"].append(stop_reason)
        out["rollout_logprobs"].append([float(x) for x in np.asarray(row.logprobs)[s:]])
        out["trajectory_ids"].append({"instance_id": str(row.group_id), "repetition_id": k})
        out["is_last_step"].append(i == len(kept) - 1 or kept[i + 1].row.rollout_id != row.rollout_id)
    out["rollout_metrics"] = None
    return out


def rows_to_prime_samples(rows: Sequence[Row], *, env_name: str, loss_mode: str = "token-mean",
                          temperature: float = 1.0, estimator: str = "grpo",
                          scale_by_std: bool = True) -> list[dict[str, Any]]:
    """prime-rl `TrainingSample`s (as dicts of its fields), one per row of a valid rollout, over the
    full row (prime-rl has no prompt/completion split): `token_ids`, `mask` (the loss mask),
    `logprobs`, `temperatures`, `env_name`, `advantages` (the rollout's advantage on every token)
    and `rl_weights` = rowgrove's loss weight x T, T = the tokens with a nonzero weight in these
    rows. prime-rl normalizes its rl component by the global count of tokens whose weight is
    nonzero, which is T when these rows are the whole step, so its rl loss is rowgrove's."""
    weighted = weigh_rows(rows, loss_mode=loss_mode, estimator=estimator, scale_by_std=scale_by_std).rows
    T = sum(int(np.count_nonzero(w.weight_T)) for w in weighted)
    out = []
    for w in weighted:
        n = len(w.row.input_ids)
        out.append({
            "token_ids": [int(x) for x in w.row.input_ids],
            "mask": [bool(x) for x in np.asarray(w.row.loss_mask) != 0],
            "logprobs": [float(x) for x in np.asarray(w.row.logprobs)],
            "temperatures": [float(temperature)] * n,
            "env_name": env_name,
            "advantages": [float(w.row.advantage)] * n,
            "rl_weights": [float(x) * T for x in w.weight_T],
        })
    return out


__all__ = ["rows_to_prime_samples", "rows_to_skyrl_output", "rows_to_slime_samples", "slime_reward_post_process"]
