"""Group baselines: one advantage per rollout, computed per explicit group id.

Why this module exists: frameworks have shipped GRPO baselines computed over rows instead of
rollouts (NeMo RL PR #4124), and groups inferred by reshaping a flat reward vector, which silently turns
into a batch-wide baseline when group sizes are uneven (slime PR #2204: a group whose rewards are all
5.0 got -1.090909 instead of 0). Here a group is whatever rollouts share a `group_id`, in any
order, of any size; nothing is inferred.

Shapes: `rewards_R`, `adv_R` hold one value per rollout; `codes_R` maps each rollout to a group
bin in `[0, B)`; per-bin arrays end in `_B` (some bins may be empty).

    group_advantages   rewards_R + group ids  -> adv_R       (the vectorized kernel)
    assign_advantages  rows (several per rollout) -> new rows with the rollout's advantage copied on
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable, Sequence

import numpy as np

from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

ESTIMATORS = ("grpo", "dr_grpo", "rloo")

# An integer id array is used directly as bin numbers (ids - min) when its range is at most this
# many times the number of rollouts; wider ranges are factorized with np.unique (a sort).
_DENSE_RANGE_FACTOR = 4


def _factorize(group_ids: object, n: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Map ids to bin numbers: `(codes_R, B, missing_R)`, `missing_R` true where the id is None.

    Bins need not be contiguous (empty bins are harmless to bincount). Integer ids of modest range
    use `id - min` (linear); str ids are sorted by hash and checked exactly; anything else (and a
    failed check) goes through one dict built at C level, where a new id's bin is the position of
    its first occurrence.
    """
    if isinstance(group_ids, np.ndarray) and group_ids.dtype.kind in "iub":
        ids_R = group_ids.reshape(-1).astype(np.int64, copy=False)
        if n == 0:
            return np.zeros(0, np.intp), 0, np.zeros(0, bool)
        lo, hi = int(ids_R.min()), int(ids_R.max())
        if hi - lo < _DENSE_RANGE_FACTOR * n + 1024:
            return (ids_R - lo).astype(np.intp, copy=False), hi - lo + 1, np.zeros(n, bool)
        _, codes_R = np.unique(ids_R, return_inverse=True)
        return codes_R.astype(np.intp, copy=False), int(codes_R.max()) + 1, np.zeros(n, bool)
    if isinstance(group_ids, np.ndarray):
        group_ids = group_ids.reshape(-1).tolist()
    ids = group_ids if isinstance(group_ids, list) else list(group_ids)  # type: ignore[call-overload]
    if ids and type(ids[0]) is int:
        as_array = np.asarray(ids)
        if as_array.dtype.kind in "iu":
            return _factorize(as_array, n)
    if ids and type(ids[0]) is str:
        # str ids: group by Python's hash with one vectorized sort, then check exactly, as fixed-
        # width text, that every rollout equals its group's first member. A None, a non-str id or
        # a hash collision fails the check and falls through to the dict below. Measured faster
        # than the dict and more robust when other processes share the cache (bench_advantages).
        try:
            hashes_R = np.fromiter(map(hash, ids), dtype=np.int64, count=n)
        except TypeError as e:
            raise InputError(f"group ids must be hashable (str or int): {e}") from None
        order_R = np.argsort(hashes_R)
        sorted_R = hashes_R[order_R]
        starts_R = np.empty(n, bool)
        starts_R[:1] = True
        np.not_equal(sorted_R[1:], sorted_R[:-1], out=starts_R[1:])
        codes_R = np.empty(n, np.intp)
        codes_R[order_R] = np.cumsum(starts_R) - 1
        member_G = order_R[starts_R]  # one rollout of each hash bin
        text_R = np.asarray(ids)
        if text_R.dtype.kind == "U" and bool((text_R == text_R[member_G][codes_R]).all()):
            return codes_R, len(member_G), np.zeros(n, bool)
    first: dict[Hashable, int] = {}
    try:
        codes_R = np.fromiter(map(first.setdefault, ids, range(n)), dtype=np.intp, count=n)
    except TypeError as e:
        raise InputError(f"group ids must be hashable (str or int): {e}") from None
    missing_R = codes_R == first[None] if None in first else np.zeros(n, bool)
    return codes_R, n, missing_R


def group_advantages(
    rewards: Sequence[float] | np.ndarray,
    group_ids: Sequence[Hashable | None] | np.ndarray | None,
    *,
    estimator: str = "grpo",
    scale_by_std: bool = True,
    eps: float = 1e-6,
    group_size: int | None = None,
) -> np.ndarray:
    """One advantage per rollout, float64, in input order.

    `group_ids[i]` names the group (prompt) of rollout i; groups may have any sizes and appear in
    any order. A group of one, and a group whose rewards are all equal, get exactly 0.0. Ids
    missing (None) for some rollouts raise InputError naming them; ids missing for all rollouts
    (or `group_ids=None`) raise unless `group_size` says the rollouts come in contiguous groups of
    that size. Non-finite rewards and unknown estimators raise InputError.

    Estimators (divisors named; n = group size, mean = group mean of rewards):
      grpo     (r - mean) / (std + eps), std the sample std (ddof=1), when `scale_by_std`;
               otherwise r - mean.                  (DeepSeekMath GRPO; verl, TRL default)
      dr_grpo  r - mean, no std divisor.            (Dr. GRPO, Liu et al. 2025)
      rloo     r - mean of the n-1 others = n/(n-1) * (r - mean). (Ahmadian et al. 2024)
    """
    rewards_R = np.asarray(rewards, dtype=np.float64)
    if rewards_R.ndim != 1:
        raise InputError(f"rewards must be one number per rollout (1-D), got shape {rewards_R.shape}")
    n = rewards_R.shape[0]
    if estimator not in ESTIMATORS:
        raise InputError(f"unknown estimator {estimator!r}: use one of {', '.join(ESTIMATORS)}")
    finite_R = np.isfinite(rewards_R)
    if not finite_R.all():
        bad = np.flatnonzero(~finite_R).tolist()
        raise InputError(
            f"reward is not finite for {len(bad)} of {n} rollouts (positions {name_some(bad)}): "
            "give every valid rollout a finite reward, or mark it invalid"
        )

    all_missing = group_ids is None
    if not all_missing:
        if len(group_ids) != n:  # type: ignore[arg-type]
            raise InputError(f"got {n} rewards but {len(group_ids)} group ids: give one id per rollout")  # type: ignore[arg-type]
        codes_R, n_bins, missing_R = _factorize(group_ids, n)
        n_missing = int(missing_R.sum())
        if n_missing == n and n > 0:
            all_missing = True
        elif n_missing:
            where = np.flatnonzero(missing_R).tolist()
            raise InputError(
                f"group_id missing for {n_missing} of {n} rollouts (positions {name_some(where)}): "
                "give every rollout the id of its prompt"
            )
        elif group_size is not None:
            raise InputError("give either group_ids or group_size, not both")
    if all_missing:
        if group_size is None:
            raise InputError(
                f"group_id missing for all {n} rollouts: give every rollout the id of its prompt, "
                "or pass group_size if the rollouts come in contiguous groups of one size"
            )
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise InputError(f"group_size must be a positive int, got {group_size!r}")
        if n % group_size:
            raise InputError(
                f"{n} rollouts do not split into contiguous groups of {group_size}: "
                "give explicit group ids instead"
            )
        codes_R = np.arange(n, dtype=np.intp) // group_size
        n_bins = n // group_size
    if n == 0:
        return np.zeros(0, np.float64)

    counts_B = np.bincount(codes_R, minlength=n_bins)
    # Shift each group by one of its own rewards before averaging: the mean is then that reward
    # plus the mean deviation, so a uniform group has deviations of exactly 0 and comes out exactly
    # 0 (a float mean of equal values need not equal them), and the sums are better conditioned.
    some_B = np.empty(n_bins, np.float64)
    some_B[codes_R] = rewards_R  # any member's reward will do
    dev_R = rewards_R - some_B[codes_R]
    with np.errstate(invalid="ignore", divide="ignore"):
        dev_mean_B = np.bincount(codes_R, weights=dev_R, minlength=n_bins) / counts_B
    centered_R = dev_R - dev_mean_B[codes_R]  # r - group mean

    if estimator == "grpo" and scale_by_std:
        # divisor: the group's sample std (ddof=1) + eps; a group of one has std 0, so 0 / eps = 0
        sq_B = np.bincount(codes_R, weights=centered_R * centered_R, minlength=n_bins)
        std_B = np.sqrt(np.divide(sq_B, counts_B - 1, out=np.zeros(n_bins), where=counts_B > 1))
        denom_B = std_B + eps
        denom_B[denom_B == 0] = 1.0  # eps=0 on a uniform group: 0 / 1, never 0 / 0
        return centered_R / denom_B[codes_R]
    elif estimator in ("grpo", "dr_grpo"):
        # divisor: none; the baseline is the group mean (Dr. GRPO; grpo with scale_by_std=False)
        return centered_R
    elif estimator == "rloo":
        # divisor: n - 1, the number of other members; r - (S - r)/(n-1) = n/(n-1) * (r - mean)
        factor_B = np.divide(counts_B, counts_B - 1, out=np.zeros(n_bins), where=counts_B > 1)
        return centered_R * factor_B[codes_R]
    else:
        raise InputError(f"unknown estimator {estimator!r}: use one of {', '.join(ESTIMATORS)}")


def _disagreements(ids: Sequence[object], bad: dict[int, list[object]], limit: int = 5) -> str:
    """`r7: 0.5 vs 1.0; r9: ...`: the first few rollouts whose rows disagree, with their values."""
    return "; ".join(f"{ids[k]}: {' vs '.join(sorted({repr(v) for v in vals}))}" for k, vals in list(bad.items())[:limit])


def _same(a: object, b: object) -> bool:
    """Equal rewards, counting two NaNs (or two Nones) as the same value."""
    if a is None or b is None:
        return a is b
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def assign_advantages(
    rows: Sequence[Row], *, estimator: str = "grpo", scale_by_std: bool = True
) -> list[Row]:
    """New rows (input order kept) carrying their rollout's one advantage.

    Rows are grouped into rollouts by `rollout_id`. Every row of a rollout must carry the same
    reward and the same group_id, else InputError naming the rollout and the values. A rollout's
    validity is the minimum over its rows; invalid rollouts take no part in any baseline and all
    their rows come back `valid=False`, advantage 0.0, with a mask reason (their own, or a
    sibling's). A valid rollout must have a finite reward and a group id (all valid rollouts, or
    none: then InputError). A group with fewer than two valid members gets advantage 0.
    """
    rows = list(rows)
    if estimator not in ESTIMATORS:
        raise InputError(f"unknown estimator {estimator!r}: use one of {', '.join(ESTIMATORS)}")
    index: dict[str, int] = {}
    rollout_of_N = [index.setdefault(row.rollout_id, len(index)) for row in rows]
    ids = list(index)
    n_rollouts = len(ids)
    first_row = [-1] * n_rollouts
    valid_R = [True] * n_rollouts
    reason_R: list[str | None] = [None] * n_rollouts
    bad_reward: dict[int, list[object]] = {}
    bad_group: dict[int, list[object]] = {}
    for i, (row, k) in enumerate(zip(rows, rollout_of_N, strict=True)):
        if first_row[k] < 0:
            first_row[k] = i
        else:
            head = rows[first_row[k]]
            if not _same(row.reward, head.reward):
                bad_reward.setdefault(k, [head.reward]).append(row.reward)
            if row.group_id != head.group_id:
                bad_group.setdefault(k, [head.group_id]).append(row.group_id)
        if not row.valid:
            valid_R[k] = False
            reason_R[k] = reason_R[k] or row.mask_reason
    if bad_reward:
        raise InputError(
            f"rows of {len(bad_reward)} rollouts disagree on the reward ({_disagreements(ids, bad_reward)}): "
            "a rollout has one reward; copy it onto every row instead of averaging"
        )
    if bad_group:
        raise InputError(
            f"rows of {len(bad_group)} rollouts disagree on the group_id ({_disagreements(ids, bad_group)}): "
            "a rollout belongs to one group; give all its rows the id of its prompt"
        )

    live = [k for k in range(n_rollouts) if valid_R[k]]
    rewards = [rows[first_row[k]].reward for k in live]
    no_reward = [ids[k] for k, r in zip(live, rewards, strict=True) if r is None]
    if no_reward:
        raise InputError(
            f"reward missing for {len(no_reward)} valid rollouts ({name_some(no_reward)}): "
            "finish every rollout with a reward, or mark it invalid"
        )
    rewards_V = np.asarray(rewards, dtype=np.float64)
    not_finite = [ids[k] for k, r in zip(live, rewards_V.tolist(), strict=True) if not math.isfinite(r)]
    if not_finite:
        raise InputError(
            f"reward is not finite for {len(not_finite)} valid rollouts ({name_some(not_finite)}): "
            "give a finite reward, or mark the rollout invalid"
        )
    groups = [rows[first_row[k]].group_id for k in live]
    no_group = [ids[k] for k, g in zip(live, groups, strict=True) if g is None]
    if no_group:
        raise InputError(
            f"group_id missing for {len(no_group)} of {len(live)} valid rollouts "
            f"({name_some(no_group)}): give every rollout the id of its prompt"
        )
    adv_V = group_advantages(rewards_V, groups, estimator=estimator, scale_by_std=scale_by_std)
    adv_R = [0.0] * n_rollouts
    for k, a in zip(live, adv_V.tolist(), strict=True):
        adv_R[k] = a

    out: list[Row] = []
    for row, k in zip(rows, rollout_of_N, strict=True):
        if valid_R[k]:
            out.append(dataclasses.replace(row, advantage=adv_R[k], valid=True))
        else:
            reason = row.mask_reason or reason_R[k] or "another row of this rollout is invalid"
            out.append(dataclasses.replace(row, advantage=0.0, valid=False, mask_reason=reason))
    return out
