"""rowgrove rows into verl (`pip install 'rowgrove[verl]'`, verl 0.9.1 in its own environment:
verl caps transformers < 5.11).

    rows_to_dataproto(rows, pad_token_id=...)  -> verl.DataProto with prompts, responses,
                                                  response_mask, input_ids, attention_mask,
                                                  position_ids, rollout_log_probs, old_log_probs,
                                                  advantages, token_level_rewards; uid, rollout_id
    "rowgrove" advantage estimator             (algorithm.adv_estimator=rowgrove)
    "rowgrove" policy loss                     (actor.policy_loss.loss_mode=rowgrove)

Importing this module registers both names with verl's registries
(`verl/trainer/ppo/core_algos.py`: `register_adv_est`, `register_policy_loss`).

Why: verl aggregates its policy loss per row. A rollout that became 3 rows (compaction,
sub-agents) weighs 3x under `seq-mean-token-mean`, and its built-in `grpo` estimator computes the
group baseline over rows, so the rollout's reward is counted 3 times (open PR verl#7580 adds a
per-row loss weight). verl's loss function receives no per-token weight, but it does multiply
the advantage token by token. So the advantage verl reads for token t of row i is

    advantages[i, t] = A_rollout(i) * w[i][t] * C

with A from `rowgrove.algo.assign_advantages` (explicit group ids, one reward per rollout) and w
from `rowgrove.algo.loss_weights(rows, loss_mode)` ("token-mean" or "rollout-mean"; the weights
of a mini-batch sum to 1). With `actor.loss_agg_mode="token-sum"` verl's loss is
`sum(loss_mat * response_mask) * dp_size` per micro-batch, gradients are averaged over the dp
ranks and summed over micro-batches, so C = 1 and verl's loss is rowgrove's whatever the
micro-batching (fixed `ppo_micro_batch_size_per_gpu` or `use_dynamic_bsz`) and the dp size. With
`loss_agg_mode="token-mean"` verl divides by the mini-batch's response-mask tokens T (global), so
C = T. Sequence-level modes divide by rows and are refused.

Exact as long as one verl mini-batch holds the whole batch (`actor.ppo_mini_batch_size *
rollout.n >= rows`; verl cuts mini-batches by rows) and nothing else enters the loss (KL loss,
entropy bonus, rollout-correction weights): `check_verl_config` refuses the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rowgrove.errors import InputError, name_some
from rowgrove.integrations.weighting import LOSS_MODES, Weighted, check_mode, padded_layout, weigh_rows
from rowgrove.types import Row

NAME = "rowgrove"
AGG_MODES = ("token-sum", "token-mean")


class RolloutKey(str):
    """A row's `uid` in the DataProto: the group id itself (a str equal to it, so verl and any
    code grouping by uid group by prompt), carrying what the "rowgrove" estimator needs and verl
    does not pass it: the row's `rollout_id` and the update's settings."""

    rollout_id: str
    loss_mode: str
    loss_agg_mode: str
    estimator: str
    scale_by_std: bool

    def __new__(cls, group_id: str, rollout_id: str, loss_mode: str, loss_agg_mode: str, estimator: str,
                scale_by_std: bool) -> RolloutKey:
        key = super().__new__(cls, group_id)
        key.rollout_id = rollout_id
        key.loss_mode = loss_mode
        key.loss_agg_mode = loss_agg_mode
        key.estimator = estimator
        key.scale_by_std = scale_by_std
        return key

    def __reduce__(self) -> tuple[Any, ...]:  # pickled across Ray workers with its fields
        return (RolloutKey, (str(self), self.rollout_id, self.loss_mode, self.loss_agg_mode, self.estimator,
                             self.scale_by_std))


def _check_agg(loss_agg_mode: str) -> None:
    if loss_agg_mode not in AGG_MODES:
        raise InputError(
            f"loss_agg_mode {loss_agg_mode!r} cannot carry rowgrove's weights: use 'token-sum' (constant 1) or "
            "'token-mean' (constant T, the mini-batch's response tokens); sequence modes divide by rows, so a "
            "rollout split into k rows would weigh k times"
        )


def constant(loss_agg_mode: str, response_tokens: int) -> float:
    """C in advantages = A * w * C: 1 for "token-sum", T (response-mask tokens of the batch, verl's
    `batch_num_tokens` when the batch is one mini-batch) for "token-mean"."""
    _check_agg(loss_agg_mode)
    return 1.0 if loss_agg_mode == "token-sum" else float(response_tokens)


def _layout(weighted: Weighted, *, pad_token_id: int, max_prompt_length: int | None,
            max_response_length: int | None) -> dict[str, np.ndarray]:
    """numpy arrays of the DataProto (prompts left-padded, responses right-padded, as verl's rollout
    writes them); advantages still without C."""
    rows = weighted.rows
    p_len = [w.start for w in rows]
    r_len = [len(w.row.input_ids) - w.start for w in rows]
    P = max(p_len) if max_prompt_length is None else max_prompt_length
    R = max(r_len) if max_response_length is None else max_response_length
    long_p = [w.row.rollout_id for w, n in zip(rows, p_len, strict=True) if n > P]
    long_r = [w.row.rollout_id for w, n in zip(rows, r_len, strict=True) if n > R]
    if long_p or long_r:
        raise InputError(
            f"rows longer than the layout: {len(long_p)} prompts over {P} tokens ({name_some(long_p)}), "
            f"{len(long_r)} responses over {R} tokens ({name_some(long_r)}): raise max_prompt_length / "
            "max_response_length (rows are never truncated: that would drop sampled tokens)"
        )
    lay = padded_layout(rows, pad=pad_token_id, prompt_len=P, response_len=R)
    prompts, p_mask, responses, r_mask = lay["prompts"], lay["prompt_mask"], lay["responses"], lay["response_attention"]
    response_mask, logp, coef = lay["loss_mask"], lay["logprobs"], lay["coef"]
    rewards = np.zeros((len(rows), R), np.float64)
    for i, n in enumerate(r_len):
        rewards[i, n - 1] = float(rows[i].row.reward)  # verl puts the score on the last response token
    attention = np.concatenate([p_mask, r_mask], axis=1)
    position = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
    return {"prompts": prompts, "responses": responses, "input_ids": np.concatenate([prompts, responses], axis=1),
            "attention_mask": attention, "position_ids": position, "response_mask": response_mask,
            "rollout_log_probs": logp, "coef": coef, "token_level_rewards": rewards}


def rows_to_dataproto(rows: Sequence[Row], *, pad_token_id: int, loss_mode: str = "token-mean",
                      loss_agg_mode: str = "token-sum", estimator: str = "grpo", scale_by_std: bool = True,
                      max_prompt_length: int | None = None, max_response_length: int | None = None) -> Any:
    """One update's rows as a `verl.DataProto` whose advantages make verl's own loss rowgrove's.

    Per row: `prompts` = the tokens before its first generated token (left-padded), `responses` =
    the rest (right-padded); `response_mask` = the row's loss mask over the response (tool output
    and tokens another row trains stay 0); `input_ids`, `attention_mask`, `position_ids` as verl's
    rollout writes them; `rollout_log_probs` = the engine's logprobs (and `old_log_probs`, the same:
    rowgrove's ratio is against the engine, as in verl's bypass mode); `advantages` = A * w * C
    per response token (see the module docstring; C from `constant`); `token_level_rewards` = the
    rollout's reward on the last response token. Non-tensor `uid` = the group id (a `RolloutKey`,
    a str equal to it) and `rollout_id`. `meta_info["rowgrove"]` names the settings and the counts.

    Errors are `rowgrove.algo`'s, with its messages: rows of a rollout disagreeing on reward or
    group id, group ids missing, non-finite rewards. Rows of invalid rollouts and rows without a
    generated token are dropped (their weight is 0; counted in meta_info). Tensors are int64 and
    float32, on the CPU.
    """
    import torch
    from verl import DataProto

    check_mode(loss_mode)
    _check_agg(loss_agg_mode)
    weighted = weigh_rows(rows, loss_mode=loss_mode, estimator=estimator, scale_by_std=scale_by_std)
    a = _layout(weighted, pad_token_id=pad_token_id, max_prompt_length=max_prompt_length,
                max_response_length=max_response_length)
    c = constant(loss_agg_mode, int(a["response_mask"].sum()))
    adv = a.pop("coef") * c
    tensors = {k: torch.as_tensor(v, dtype=torch.float32 if v.dtype == np.float64 else torch.int64) for k, v in a.items()}
    tensors["old_log_probs"] = tensors["rollout_log_probs"].clone()
    tensors["advantages"] = torch.as_tensor(adv, dtype=torch.float32)
    uid = np.empty(len(weighted.rows), dtype=object)
    rid = np.empty(len(weighted.rows), dtype=object)
    for i, w in enumerate(weighted.rows):
        uid[i] = RolloutKey(str(w.row.group_id), w.row.rollout_id, loss_mode, loss_agg_mode, estimator, scale_by_std)
        rid[i] = w.row.rollout_id
    meta = {NAME: {"loss_mode": loss_mode, "loss_agg_mode": loss_agg_mode, "constant": c, "estimator": estimator,
                   "rows": len(weighted.rows), "rollouts": len(weighted.rollout_ids),
                   "dropped_invalid_rows": weighted.dropped_invalid, "dropped_empty_rows": weighted.dropped_empty}}
    return DataProto.from_dict(tensors=tensors, non_tensors={"uid": uid, "rollout_id": rid}, meta_info=meta)


# ---- the registered estimator and policy loss -------------------------------------------------

def compute_rowgrove_advantage(token_level_rewards: Any, response_mask: Any, index: Any = None,
                               config: Any = None, **kwargs: Any) -> tuple[Any, Any]:
    """verl advantage estimator "rowgrove": `(advantages, returns)`, both A * w * C per response token.

    Rows are grouped into rollouts by the `rollout_id` each `uid` carries (`RolloutKey`, written by
    `rows_to_dataproto`) and into groups by the uid itself; a rollout's reward is its rows'
    `token_level_rewards` sum (they must agree: one reward per rollout). Then
    `rowgrove.algo.assign_advantages` and `loss_weights`, as `rows_to_dataproto` computed them: the
    result equals its `advantages` (up to float32). A uid that is not a RolloutKey raises: a plain
    uid cannot tell the rows of one rollout apart from several rollouts.
    """
    import torch

    keys = list(index) if index is not None else []
    bad = [i for i, k in enumerate(keys) if not isinstance(k, RolloutKey)]
    if index is None or bad:
        raise InputError(
            f"the rowgrove estimator needs rows from rowgrove.integrations.verl.rows_to_dataproto: "
            f"{'no uid' if index is None else f'{len(bad)} uids (positions {name_some(bad)}) are plain ids'}, "
            "which cannot tell a rollout's rows from separate rollouts"
        )
    first = keys[0]
    mask = response_mask.detach().cpu().numpy() != 0
    rewards = token_level_rewards.detach().to(torch.float64).sum(-1).cpu().numpy()
    rows = [Row(rollout_id=k.rollout_id, group_id=str(k), input_ids=np.zeros(m.size + 1, np.int32),
                loss_mask=np.concatenate([[0], m]).astype(np.int32), reward=float(r),
                logprobs=np.zeros(m.size + 1, np.float32)) for k, m, r in zip(keys, mask, rewards, strict=True)]
    weighted = weigh_rows(rows, loss_mode=first.loss_mode, estimator=first.estimator, scale_by_std=first.scale_by_std)
    c = constant(first.loss_agg_mode, int(mask.sum()))
    coef = np.zeros(mask.shape, np.float64)
    for w in weighted.rows:
        coef[w.index] = w.coef_T[1:] * c
    adv = torch.as_tensor(coef, dtype=torch.float32, device=response_mask.device)
    return adv, adv


def _cfg(config: Any, key: str, default: Any = None) -> Any:
    """`config[key]` for a mapping (dict, OmegaConf DictConfig, verl's configs), else the
    attribute; `default` when absent or None."""
    if config is None:
        return default
    value = config.get(key, default) if isinstance(config, Mapping) else getattr(config, key, default)
    return default if value is None else value


def compute_rowgrove_policy_loss(old_log_prob: Any, log_prob: Any, advantages: Any, response_mask: Any,
                                 loss_agg_mode: str = "token-sum", config: Any = None,
                                 rollout_is_weights: Any = None) -> tuple[Any, dict[str, Any]]:
    """verl policy loss "rowgrove": rowgrove's PPO-clip surrogate, aggregated by verl's `agg_loss`.

    loss_mat = -min(ratio * A, clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high) * A),
    ratio = exp(log_prob - old_log_prob), exactly `rowgrove.train.update.ppo_clip_loss` per token
    (no dual clip, no log-ratio clamp), with A = the advantages `rows_to_dataproto` or the
    "rowgrove" estimator wrote (they carry the loss weights). Aggregated with verl's
    `agg_loss(loss_mat, response_mask, loss_agg_mode, **config.global_batch_info)`. Refuses
    sequence-level aggregation modes and rollout-correction weights (they would reweigh tokens).
    """
    import torch
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.utils.torch_functional import masked_mean

    _check_agg(loss_agg_mode)
    if rollout_is_weights is not None:
        raise InputError("the rowgrove policy loss got rollout-correction weights: they reweigh tokens and break the "
                         "weights rowgrove computed; unset algorithm.rollout_correction.rollout_is")
    clip = float(_cfg(config, "clip_ratio", 0.2))
    low = float(_cfg(config, "clip_ratio_low", clip))
    high = float(_cfg(config, "clip_ratio_high", clip))
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - low, 1 + high) * advantages
    loss_mat = -torch.minimum(unclipped, clipped)
    info = dict(_cfg(config, "global_batch_info", {}) or {})
    info.pop("loss_scale_factor", None)  # only the seq-mean-token-sum-norm mode reads it
    loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **info)
    mask = response_mask.bool()
    with torch.no_grad():
        metrics = {"actor/pg_clipfrac": masked_mean((clipped < unclipped).float(), mask).item(),
                   "actor/ppo_kl": masked_mean(-log_ratio, mask).item(),
                   "actor/pg_clipfrac_lower": 0.0}
    return loss, metrics


def register() -> None:
    """Register the "rowgrove" estimator and policy loss with verl (idempotent; import does it)."""
    from verl.trainer.ppo import core_algos

    core_algos.ADV_ESTIMATOR_REGISTRY[NAME] = compute_rowgrove_advantage
    core_algos.POLICY_LOSS_REGISTRY[NAME] = compute_rowgrove_policy_loss


def check_verl_config(config: Any, n_rows: int | None = None) -> None:
    """Refuse a verl trainer config (the `ppo_trainer` OmegaConf, or a dict of the same shape) under
    which verl's loss would not be rowgrove's; InputError naming every setting to change.

    Needed: algorithm.adv_estimator=rowgrove, actor.policy_loss.loss_mode=rowgrove,
    actor.loss_agg_mode token-sum | token-mean, no KL loss or KL in reward, entropy_coeff 0, no
    rollout-correction weights or bypass mode (bypass mode swaps the policy loss for its own), and,
    given `n_rows`, one mini-batch for all rows (actor.ppo_mini_batch_size * rollout.n >= n_rows):
    verl cuts mini-batches by rows, which would split a rollout's weight across updates.
    """
    def get(path: str, default: Any = None) -> Any:
        node = config
        for part in path.split("."):
            node = _cfg(node, part, None)
            if node is None:
                return default
        return node

    problems = []
    if get("algorithm.adv_estimator") != NAME:
        problems.append(f"algorithm.adv_estimator={NAME} (is {get('algorithm.adv_estimator')!r})")
    if get("actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla") != NAME:
        problems.append(f"actor_rollout_ref.actor.policy_loss.loss_mode={NAME}")
    if get("actor_rollout_ref.actor.loss_agg_mode", "token-mean") not in AGG_MODES:
        problems.append("actor_rollout_ref.actor.loss_agg_mode=token-sum (or token-mean)")
    if get("actor_rollout_ref.actor.use_kl_loss", False):
        problems.append("actor_rollout_ref.actor.use_kl_loss=false")
    if get("algorithm.use_kl_in_reward", False):
        problems.append("algorithm.use_kl_in_reward=false")
    if float(get("actor_rollout_ref.actor.entropy_coeff", 0.0)) != 0.0:
        problems.append("actor_rollout_ref.actor.entropy_coeff=0")
    if get("algorithm.rollout_correction.bypass_mode", False):
        problems.append("algorithm.rollout_correction.bypass_mode=false (it replaces the policy loss)")
    if get("algorithm.rollout_correction.rollout_is", None):
        problems.append("algorithm.rollout_correction.rollout_is=null")
    if n_rows is not None:
        mb = int(get("actor_rollout_ref.actor.ppo_mini_batch_size", 0)) * int(get("actor_rollout_ref.rollout.n", 1))
        if mb < n_rows:
            problems.append(f"actor_rollout_ref.actor.ppo_mini_batch_size * rollout.n >= {n_rows} rows (is {mb}): "
                            "one mini-batch per step, as verl cuts mini-batches by rows")
    if problems:
        raise InputError("verl's loss would not be rowgrove's under this config; set " + "; ".join(problems))


__all__ = ["AGG_MODES", "LOSS_MODES", "NAME", "RolloutKey", "check_verl_config", "compute_rowgrove_advantage",
           "compute_rowgrove_policy_loss", "constant", "register", "rows_to_dataproto"]

register()
