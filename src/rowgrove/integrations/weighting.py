"""What every adapter needs from `rowgrove.algo`, computed once: per row, where its response
starts and the per-token coefficient `advantage x loss weight` that a trainer's loss multiplies.

A trainer whose loss is a plain weighted sum (verl `loss_agg_mode="token-sum"`, TRL `loss_type="dapo"`
with its normalizer set to 1) computes rowgrove's loss when the advantage it reads for token t of
row i is

    coef[i][t] = A_rollout(i) * w[i][t] * C

with `A` from `rowgrove.algo.assign_advantages` (one per rollout, explicit group ids) and `w` from
`rowgrove.algo.loss_weights(rows, mode)` (every divisor inside, so a rollout's weight does not
depend on its row count). The PPO-clip surrogate is positively homogeneous in the advantage
(min(r*kA, clip(r)*kA) = k*min(r*A, clip(r)*A) for k >= 0), so folding `w * C` into the advantage is
exact token by token. C is the adapter's constant (1 for a sum, the aggregation's divisor for a
mean).

Rows are split at their first generated token (loss mask 1): what comes before is the prompt,
the rest the response. Invalid rollouts and rows with no generated token carry weight 0 on every
token: they are left out (what they would add to the loss is exactly 0) and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rowgrove.algo import assign_advantages, loss_weights
from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

LOSS_MODES = ("token-mean", "rollout-mean")


@dataclass(frozen=True)
class WeightedRow:
    """A row ready for a trainer: `row` carries its rollout's advantage; `index` is its position in the input; `start` is the position of
    its first generated token (prompt = input_ids[:start], response = input_ids[start:]);
    `weight_T` is rowgrove's loss weight per token of the whole row and `coef_T` = advantage x
    weight (both float64, the row's length)."""

    row: Row
    index: int
    start: int
    weight_T: np.ndarray
    coef_T: np.ndarray


@dataclass(frozen=True)
class Weighted:
    """The rows kept (input order), and how many were left out and why (their weight is 0)."""

    rows: list[WeightedRow]
    dropped_invalid: int
    dropped_empty: int

    @property
    def rollout_ids(self) -> list[str]:
        return list(dict.fromkeys(w.row.rollout_id for w in self.rows))


def check_mode(loss_mode: str) -> None:
    if loss_mode not in LOSS_MODES:
        raise InputError(
            f"loss_mode {loss_mode!r} cannot be carried into another trainer's loss: use one of "
            f"{', '.join(LOSS_MODES)} (seq-mean-token-mean divides by rows; it is refused once a rollout has several rows)"
        )


def weigh_rows(rows: Sequence[Row], *, loss_mode: str = "token-mean", estimator: str = "grpo",
               scale_by_std: bool = True) -> Weighted:
    """Advantages (`assign_advantages`) and loss weights (`loss_weights(rows, loss_mode)`) of one
    update's rows, as `rowgrove.algo` computes them; errors are algo's own (a rollout's rows
    disagreeing on reward or group, group ids missing, a non-finite reward). Every valid row must
    carry the engine's logprobs. Rows of invalid rollouts and rows with no generated token are
    left out (their weights are all 0) and counted."""
    check_mode(loss_mode)
    rows = list(rows)
    if not rows:
        raise InputError("no rows: give the rows of at least one finished rollout")
    no_lp = [r.rollout_id for r in rows if r.valid and r.logprobs is None]
    if no_lp:
        raise InputError(f"{len(no_lp)} rows have no logprobs ({name_some(no_lp)}): "
                         "rows must carry the engine's logprobs")
    rows = assign_advantages(rows, estimator=estimator, scale_by_std=scale_by_std)
    weights = loss_weights(rows, loss_mode)
    kept: list[WeightedRow] = []
    invalid = empty = 0
    for i, (row, w_T) in enumerate(zip(rows, weights, strict=True)):
        if not row.valid:
            invalid += 1
            continue
        mask = np.asarray(row.loss_mask) != 0
        if not mask.any():
            empty += 1
            continue
        start = int(mask.argmax())
        if start == 0:
            raise InputError(f"row of rollout {row.rollout_id} has loss_mask 1 on its first token: "
                             "a trained token needs at least one token of context")
        lp = np.asarray(row.logprobs, np.float64)
        if lp.shape != (len(row.input_ids),):
            raise InputError(f"row of rollout {row.rollout_id}: {lp.size} logprobs for {len(row.input_ids)} tokens")
        kept.append(WeightedRow(row, i, start, np.asarray(w_T, np.float64), float(row.advantage) * np.asarray(w_T, np.float64)))
    if not kept:
        raise InputError(f"none of the {len(rows)} rows has a generated token of a valid rollout "
                         f"({invalid} rows of invalid rollouts): nothing to train on")
    return Weighted(kept, invalid, empty)


def padded_layout(rows: Sequence[WeightedRow], *, pad: int, prompt_len: int, response_len: int,
                  n_rows: int | None = None) -> dict[str, np.ndarray]:
    """The rows as trainers lay them out: prompts (the tokens before the first sampled one)
    left-padded to `prompt_len`, responses right-padded to `response_len`, with their attention
    masks, the loss mask, the engine's logprobs and the coefficient A x w over the response.
    `n_rows` (>= len(rows)) adds all-padding rows at the end. Callers check the lengths first."""
    n = len(rows) if n_rows is None else n_rows
    out = {"prompts": np.full((n, prompt_len), pad, np.int64), "prompt_mask": np.zeros((n, prompt_len), np.int64),
           "responses": np.full((n, response_len), pad, np.int64),
           "response_attention": np.zeros((n, response_len), np.int64),
           "loss_mask": np.zeros((n, response_len), np.int64), "logprobs": np.zeros((n, response_len), np.float64),
           "coef": np.zeros((n, response_len), np.float64)}
    for i, w in enumerate(rows):
        ids = np.asarray(w.row.input_ids, np.int64)
        s, m = w.start, len(ids) - w.start
        out["prompts"][i, prompt_len - s:] = ids[:s]
        out["prompt_mask"][i, prompt_len - s:] = 1
        out["responses"][i, :m] = ids[s:]
        out["response_attention"][i, :m] = 1
        out["loss_mask"][i, :m] = np.asarray(w.row.loss_mask)[s:] != 0
        out["logprobs"][i, :m] = np.asarray(w.row.logprobs, np.float64)[s:]
        out["coef"][i, :m] = w.coef_T[s:]
    return out

