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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

MODES = ("token-mean", "rollout-mean", "seq-mean-token-mean")


def loss_weights(rows: Sequence[Row], mode: str = "token-mean") -> list[np.ndarray]:
    """One float64 weight per token of each row (same length as the row), in input order.

    The weights of all generated tokens of valid rollouts sum to 1 whenever there is at least one
    such token; with none, every weight is 0 (never NaN). Unknown modes, rows whose loss_mask and
    input_ids differ in length, and `seq-mean-token-mean` on a rollout with several rows raise
    InputError.
    """
    if mode not in MODES:
        raise InputError(f"unknown loss mode {mode!r}: use one of {', '.join(MODES)}")
    rows = list(rows)
    masks_N: list[np.ndarray] = []
    index: dict[str, int] = {}
    rollout_of_N: list[int] = []
    bad_len: list[str] = []
    for row in rows:
        mask_T = np.asarray(row.loss_mask)
        if mask_T.ndim != 1 or mask_T.shape[0] != len(row.input_ids):
            bad_len.append(row.rollout_id)
        masks_N.append((mask_T != 0).astype(np.float64))
        rollout_of_N.append(index.setdefault(row.rollout_id, len(index)))
    if bad_len:
        raise InputError(
            f"loss_mask and input_ids differ in length on rows of {len(bad_len)} rollouts "
            f"({name_some(bad_len)}): give one mask value per token"
        )
    n_rollouts = len(index)
    rollout_N = np.asarray(rollout_of_N, dtype=np.intp)
    invalid_R = np.zeros(n_rollouts, bool)
    if rows:
        invalid_R[rollout_N[[not row.valid for row in rows]]] = True
    live_N = ~invalid_R[rollout_N]  # the row's rollout is valid
    gen_N = np.asarray([m.sum() for m in masks_N], dtype=np.float64) * live_N
    scale_N = np.zeros(len(rows), np.float64)  # weight of one generated token of row i

    if mode == "token-mean":
        # divisor: T, generated tokens of valid rollouts in these rows (NeMo RL PR #4124: 7 + 7 = 14)
        total = gen_N.sum()
        if total > 0:
            scale_N = np.where(gen_N > 0, 1.0 / total, 0.0)
    elif mode == "rollout-mean":
        # divisor: R * T_rollout, R = distinct valid rollouts with a generated token (never rows)
        gen_R = np.bincount(rollout_N, weights=gen_N, minlength=n_rollouts)
        n_live = int((gen_R > 0).sum())
        if n_live:
            per_R = np.divide(1.0, n_live * gen_R, out=np.zeros(n_rollouts), where=gen_R > 0)
            scale_N = per_R[rollout_N] * (gen_N > 0)
    elif mode == "seq-mean-token-mean":
        # divisor: N * T_row, N = rows with a generated token; only sound when rows == rollouts
        rows_R = np.bincount(rollout_N, minlength=n_rollouts)
        split = [rid for rid, k in index.items() if rows_R[k] > 1]
        if split:
            raise InputError(
                f"seq-mean-token-mean divides by rows, and {len(split)} rollouts have several rows "
                f"({name_some(split)}): use token-mean or rollout-mean"
            )
        n_live = int((gen_N > 0).sum())
        if n_live:
            scale_N = np.divide(1.0, n_live * gen_N, out=np.zeros(len(rows)), where=gen_N > 0)
    else:
        raise InputError(f"unknown loss mode {mode!r}: use one of {', '.join(MODES)}")
    return [mask_T * s for mask_T, s in zip(masks_N, scale_N.tolist(), strict=True)]
