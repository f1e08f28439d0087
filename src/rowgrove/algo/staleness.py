"""How far behind the policy a rollout was sampled, from the weight version on every token.

A row's `weight_versions[t]` is the version of the weights that sampled token t (-1 where the
model sampled nothing). A rollout's staleness is measured on the tokens it trains:

    staleness(ρ) = current_version − min { weight_versions[t] : t trained in ρ }

over all rows of ρ, "trained" = loss_mask 1 and version >= 0. It is a property of the rollout's
tokens, never of its rows: however the tokens are split into rows, the minimum is the same. A
rollout with versions but no trained token is 0 behind. A rollout with a row whose versions are
unknown (None: a ledger written before versions were recorded) has no staleness: it is left out,
and `mask_stale` never masks it, because its oldest token cannot be vouched for.

`mask_stale` drops whole rollouts (every row `valid=False`), so one reward stays one reward: a
rollout is trained entirely or not at all, and the advantage baseline of its group is taken over
the rollouts that remain (see `assign_advantages`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

STALE = "stale"


def staleness(rows: Sequence[Row], current_version: int) -> dict[str, int]:
    """Per rollout id (in first-seen order): `current_version` minus the oldest weight version
    among the rollout's trained tokens over all its rows; 0 when it trains no token. Rollouts
    with a row whose `weight_versions` is None are left out (unknown).

    InputError when a row's versions and input_ids differ in length, or a trained token is newer
    than `current_version` (the version passed is not the policy's).
    """
    oldest: dict[str, int | None] = {}   # rollout → oldest trained version (None: none trained yet)
    unknown: set[str] = set()
    bad_len: list[str] = []
    for row in rows:
        rid = row.rollout_id
        oldest.setdefault(rid, None)
        if row.weight_versions is None:
            unknown.add(rid)
            continue
        v_T = np.asarray(row.weight_versions)
        mask_T = np.asarray(row.loss_mask)
        if v_T.shape != (len(row.input_ids),) or mask_T.shape != v_T.shape:
            bad_len.append(rid)
            continue
        trained = v_T[(mask_T != 0) & (v_T >= 0)]
        if trained.size:
            low = int(trained.min())
            prev = oldest[rid]
            oldest[rid] = low if prev is None else min(prev, low)
    if bad_len:
        raise InputError(
            f"weight_versions, loss_mask and input_ids differ in length on rows of {len(bad_len)} rollouts "
            f"({name_some(bad_len)}): give one version per token (-1 where the model sampled nothing)"
        )
    out = {rid: 0 if low is None else int(current_version) - low
           for rid, low in oldest.items() if rid not in unknown}
    ahead = [rid for rid, s in out.items() if s < 0]
    if ahead:
        raise InputError(
            f"{len(ahead)} rollouts ({name_some(ahead)}) hold tokens sampled by weights newer than "
            f"current_version {current_version}: pass the version the policy holds now"
        )
    return out


def mask_stale(rows: Sequence[Row], current_version: int, max_staleness: int) -> list[Row]:
    """The rows, in order, with every row of each rollout more than `max_staleness` versions
    behind (see `staleness`) masked: `valid=False`, `mask_reason="stale"` (a row that was already
    invalid with a reason keeps it: it was masked for that first). Masked rows are new Row
    objects (`dataclasses.replace`); the rows given are never changed, and every other row (of a
    rollout within the bound, or of unknown staleness) comes back as it is."""
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, int | np.integer) or max_staleness < 0:
        raise InputError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")
    ages = staleness(rows, current_version)
    stale = {rid for rid, s in ages.items() if s > max_staleness}
    return [
        dataclasses.replace(row, valid=False, mask_reason=STALE)
        if row.rollout_id in stale and (row.valid or not row.mask_reason) else row
        for row in rows
    ]
