"""The split-invariant GRPO math: advantages per rollout, loss weights, mini-batches, packing,
staleness of a rollout's tokens.

Pure numpy (torch only for a packed attention mask), no I/O, callable with literals:

    >>> group_advantages([1, 0], ["p", "p"], estimator="dr_grpo")
    array([ 0.5, -0.5])

See docs/math.md for every formula and its divisor.
"""

from rowgrove.algo.advantages import ESTIMATORS, assign_advantages, group_advantages
from rowgrove.algo.batching import minibatches, split_across_ranks
from rowgrove.algo.packing import PackedBin, pack_rows, pack_tokens, packed_attention_mask, unpack_tokens
from rowgrove.algo.staleness import mask_stale, staleness
from rowgrove.algo.weights import MODES, RolloutCounts, loss_weights, rollout_counts

__all__ = [
    "ESTIMATORS",
    "MODES",
    "PackedBin",
    "RolloutCounts",
    "assign_advantages",
    "group_advantages",
    "loss_weights",
    "mask_stale",
    "minibatches",
    "pack_rows",
    "pack_tokens",
    "packed_attention_mask",
    "rollout_counts",
    "split_across_ranks",
    "staleness",
    "unpack_tokens",
]
