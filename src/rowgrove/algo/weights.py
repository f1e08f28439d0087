"""Per-token loss weights that do not depend on how many rows a rollout became.

The step loss is `sum over rows i, tokens t of weight[i][t] * loss[i][t]`: the weights carry every
divisor, so a trainer sums (never averages) over micro-batches and workers, and gradient
accumulation cannot change the result. Weights are 0 where `loss_mask` is 0 and on every token of
an invalid rollout (a rollout is invalid when any of its rows is).

Modes (the divisor of each is named; "generated" = loss_mask 1, valid rollouts only):
    token-mean           1 / T                 T = generated tokens in the rows given
    rollout-mean         1 / (R * T_rollout)   R = valid rollouts with a generated token,
                                               T_rollout = that rollout's generated tokens
                                               (agent-lightning v1.0 report, Eq. 16)
    seq-mean-token-mean  1 / (N * T_row)       N = rows with a generated token: divides by rows,
                                               so it refuses a rollout that has several rows

Seed 002 is why the rollout-mean divisor counts distinct rollouts, never rows.

Every divisor is a function of three sums per rollout (`RolloutCounts`: generated tokens, rows,
rows marked invalid). Data-parallel training computes them on each rank's share of a mini-batch,
sums them over the ranks (one all-reduce) and passes the result as `counts=`: each rank's weights
are then the ones `loss_weights` gives the whole mini-batch in one process, however its rows are
split across the ranks (a rollout's rows may sit on different ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

MODES = ("token-mean", "rollout-mean", "seq-mean-token-mean")


@dataclass(frozen=True)
class RolloutCounts:
    """The sums behind every divisor, one entry per rollout of `ids` (all float64, shape [R]):
    `tokens_R` loss-mask-1 tokens over the rollout's rows (valid or not), `rows_R` its rows,
    `invalid_R` its rows marked invalid. Sums of counts over disjoint sets of rows (ranks) are the
    counts of their union: `RolloutCounts.from_array(ids, sum of as_array())`."""

    ids: tuple[str, ...]
    tokens_R: np.ndarray
    rows_R: np.ndarray
    invalid_R: np.ndarray

    def as_array(self) -> np.ndarray:
        """[3, R] float64: tokens, rows, invalid rows (what a rank all-reduces)."""
        return np.stack([self.tokens_R, self.rows_R, self.invalid_R]).astype(np.float64)

    @classmethod
    def from_array(cls, ids: Sequence[str], counts_3R: np.ndarray) -> RolloutCounts:
        a = np.asarray(counts_3R, np.float64)
        if a.shape != (3, len(ids)):
            raise InputError(f"rollout counts have shape {a.shape}, expected (3, {len(ids)}) for {len(ids)} rollouts")
        return cls(tuple(ids), a[0], a[1], a[2])


def rollout_counts(rows: Sequence[Row], ids: Sequence[str] | None = None) -> RolloutCounts:
    """The per-rollout sums of `rows`, indexed by `ids` (default: rollout ids in order of first
    appearance). A rollout of `ids` without rows here counts zeros; a row whose rollout is not in
    `ids` is an InputError."""
    if ids is None:
        ids = list(dict.fromkeys(row.rollout_id for row in rows))
    index = {rid: k for k, rid in enumerate(ids)}
    stray = [row.rollout_id for row in rows if row.rollout_id not in index]
    if stray:
        raise InputError(f"rows of {len(set(stray))} rollouts ({name_some(stray)}) are not among the "
                         f"{len(index)} rollouts counted: count every rollout of the mini-batch")
    c = np.zeros((3, len(index)), np.float64)
    for row in rows:
        k = index[row.rollout_id]
        c[0, k] += int(np.count_nonzero(np.asarray(row.loss_mask)))
        c[1, k] += 1
        c[2, k] += not row.valid
    return RolloutCounts.from_array(list(index), c)


def loss_weights(rows: Sequence[Row], mode: str = "token-mean", *,
                 counts: RolloutCounts | None = None) -> list[np.ndarray]:
    """One float64 weight per token of each row (same length as the row), in input order.

    The weights of all generated tokens of valid rollouts sum to 1 whenever there is at least one
    such token; with none, every weight is 0 (never NaN). Unknown modes, rows whose loss_mask and
    input_ids differ in length, and `seq-mean-token-mean` on a rollout with several rows raise
    InputError.

    `counts`: the per-rollout sums of the whole mini-batch when `rows` are only a part of it (one
    rank's share); the divisors then come from `counts`, so the parts' weights are the weights of
    the whole (they sum to 1 over all parts, not over each). Default: `rollout_counts(rows)`.
    """
    if mode not in MODES:
        raise InputError(f"unknown loss mode {mode!r}: use one of {', '.join(MODES)}")
    rows = list(rows)
    bad_len = [row.rollout_id for row in rows
               if np.asarray(row.loss_mask).ndim != 1 or len(row.loss_mask) != len(row.input_ids)]
    if bad_len:
        raise InputError(
            f"loss_mask and input_ids differ in length on rows of {len(bad_len)} rollouts "
            f"({name_some(bad_len)}): give one mask value per token"
        )
    if counts is None:
        counts = rollout_counts(rows)
    index = {rid: k for k, rid in enumerate(counts.ids)}
    missing = [row.rollout_id for row in rows if row.rollout_id not in index]
    if missing:
        raise InputError(f"counts= do not cover rollouts {name_some(missing)}: count the whole mini-batch's rows")
    masks_N = [(np.asarray(row.loss_mask) != 0).astype(np.float64) for row in rows]
    rollout_N = np.asarray([index[row.rollout_id] for row in rows], dtype=np.intp)
    live_R = counts.invalid_R == 0           # a rollout is invalid when any of its rows is
    gen_R = counts.tokens_R * live_R         # generated tokens of valid rollouts
    gen_N = np.asarray([m.sum() for m in masks_N], dtype=np.float64) * live_R[rollout_N]
    scale_N = np.zeros(len(rows), np.float64)  # weight of one generated token of row i

    if mode == "token-mean":
        # divisor: T, generated tokens of valid rollouts in these rows (NeMo RL PR #4124: 7 + 7 = 14)
        total = gen_R.sum()
        if total > 0:
            scale_N = np.where(gen_N > 0, 1.0 / total, 0.0)
    elif mode == "rollout-mean":
        # divisor: R * T_rollout, R = distinct valid rollouts with a generated token (never rows)
        n_live = int((gen_R > 0).sum())
        if n_live:
            per_R = np.divide(1.0, n_live * gen_R, out=np.zeros(len(gen_R)), where=gen_R > 0)
            scale_N = per_R[rollout_N] * (gen_N > 0)
    elif mode == "seq-mean-token-mean":
        # divisor: N * T_row, N = rows with a generated token; only sound when rows == rollouts,
        # so N is the number of valid rollouts with a generated token
        split = [rid for rid, k in index.items() if counts.rows_R[k] > 1]
        if split:
            raise InputError(
                f"seq-mean-token-mean divides by rows, and {len(split)} rollouts have several rows "
                f"({name_some(split)}): use token-mean or rollout-mean"
            )
        n_live = int((gen_R > 0).sum())
        if n_live:
            scale_N = np.divide(1.0, n_live * gen_N, out=np.zeros(len(rows)), where=gen_N > 0)
    else:
        raise InputError(f"unknown loss mode {mode!r}: use one of {', '.join(MODES)}")
    return [mask_T * s for mask_T, s in zip(masks_N, scale_N.tolist(), strict=True)]
