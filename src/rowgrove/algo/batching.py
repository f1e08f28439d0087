"""Mini-batches cut by whole rollouts, never by rows.

If mini-batches were cut by rows, a rollout split into more rows would add optimizer updates to
the step (the agent-lightning v1.0 report's second normalization, N/R extra updates, is exactly that). Cutting by
rollouts makes the number of updates ceil(R / rollouts_per_minibatch) whatever the row count, and
keeps every row of a rollout in the same update, so its loss weights are computed together.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rowgrove.errors import InputError
from rowgrove.types import Row


def minibatches(rows: Sequence[Row], rollouts_per_minibatch: int, *, seed: int = 0) -> list[list[Row]]:
    """Split rows into ceil(R / rollouts_per_minibatch) mini-batches of whole rollouts.

    Which rollouts share a mini-batch depends only on the set of rollout ids and the seed: the
    sorted ids are shuffled with `np.random.default_rng(seed)` and cut into consecutive chunks (the
    last may be smaller). It does not depend on the row count or the row order, so a rollout split
    into more rows lands in the same mini-batch. Inside a mini-batch rows keep their input order.
    Compute loss weights per mini-batch: `loss_weights(mb, mode)`.
    """
    if isinstance(rollouts_per_minibatch, bool) or not isinstance(rollouts_per_minibatch, int | np.integer):
        raise InputError(f"rollouts_per_minibatch must be a positive int, got {rollouts_per_minibatch!r}")
    if rollouts_per_minibatch < 1:
        raise InputError(f"rollouts_per_minibatch must be at least 1, got {rollouts_per_minibatch}")
    rows = list(rows)
    ids = sorted(dict.fromkeys(row.rollout_id for row in rows), key=str)
    order = np.random.default_rng(seed).permutation(len(ids))
    minibatch_of = {ids[k]: pos // rollouts_per_minibatch for pos, k in enumerate(order.tolist())}
    n_minibatches = -(-len(ids) // rollouts_per_minibatch)
    out: list[list[Row]] = [[] for _ in range(n_minibatches)]
    for row in rows:
        out[minibatch_of[row.rollout_id]].append(row)
    return out


def split_across_ranks(rows: Sequence[Row], n_ranks: int) -> list[list[Row]]:
    """One mini-batch's rows dealt to `n_ranks` data-parallel ranks, balancing tokens: rows are
    taken longest first (ties by input position) and each goes to the rank holding the fewest
    tokens so far (ties: the lowest rank). Rows, not rollouts: a rollout's rows may land on
    different ranks, which the loss weights allow as long as their divisors are the global ones
    (`loss_weights(..., counts=)`). Inside a rank rows keep their input order; a rank may get none.
    """
    if isinstance(n_ranks, bool) or not isinstance(n_ranks, int | np.integer) or n_ranks < 1:
        raise InputError(f"n_ranks must be a positive int, got {n_ranks!r}")
    rows = list(rows)
    load = [0] * n_ranks
    rank_of = [0] * len(rows)
    for i in sorted(range(len(rows)), key=lambda i: (-len(rows[i].input_ids), i)):
        r = min(range(n_ranks), key=lambda k: (load[k], k))
        rank_of[i] = r
        load[r] += len(rows[i].input_ids)
    return [[row for row, r in zip(rows, rank_of, strict=True) if r == k] for k in range(n_ranks)]
