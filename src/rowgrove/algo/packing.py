"""Sequence packing: rows into fixed-capacity bins, each row keeping its own positions.

A packed bin is the concatenation of a few rows. Position ids restart at 0 for every row and a
block-diagonal causal mask (or cu_seqlens, for varlen attention kernels) keeps rows from seeing
each other, so a packed forward gives every token the logits it has alone. Loss weights are per
token and travel with their tokens (`pack_tokens`), so packing never changes the step loss.

    pack_rows(rows or lengths, capacity) -> [PackedBin]     first-fit decreasing, or first-fit
                                                            in input order when that uses fewer bins
    pack_tokens(bins, per_row_arrays)    -> [array per bin]  weights, logprobs, loss masks, ...
    unpack_tokens(bin, packed)           -> [array per row]  back to rows
    packed_attention_mask(bin)           -> torch.BoolTensor [L, L], True where attention is allowed

Pure numpy; torch is imported only by `packed_attention_mask`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

if TYPE_CHECKING:
    import torch


@dataclass
class PackedBin:
    """One packed sequence of `length` tokens (at most the capacity).

    `row_indices[k]` is the input position of the k-th row in the bin (ascending); its tokens are
    `cu_seqlens[k]:cu_seqlens[k+1]`. `segment_ids[t]` is k for every token t of that row and
    `position_ids` restart at 0 for each row. `input_ids` is the concatenation of the rows' ids,
    or None when lengths were packed instead of rows.
    """

    row_indices: np.ndarray     # int64 [K]
    lengths: np.ndarray         # int64 [K]
    cu_seqlens: np.ndarray      # int32 [K+1], starts at 0
    position_ids: np.ndarray    # int64 [L]
    segment_ids: np.ndarray     # int32 [L]
    input_ids: np.ndarray | None  # int64 [L]

    @property
    def length(self) -> int:
        return int(self.cu_seqlens[-1])


def _first_fit(order: np.ndarray, lengths: np.ndarray, capacity: int) -> np.ndarray:
    """Bin number of each item, placing items in `order` into the first bin with room."""
    bin_of = np.empty(len(lengths), np.int64)
    room = np.empty(len(lengths), np.int64)
    n_bins = 0
    for i in order.tolist():
        size = lengths[i]
        fits = room[:n_bins] >= size
        j = int(fits.argmax()) if n_bins else 0
        if n_bins == 0 or not fits[j]:
            j = n_bins
            room[j] = capacity
            n_bins += 1
        room[j] -= size
        bin_of[i] = j
    return bin_of


def pack_rows(rows_or_lengths: Sequence[Row] | Sequence[int] | np.ndarray, capacity: int) -> list[PackedBin]:
    """Pack rows (or bare lengths) into bins of at most `capacity` tokens.

    Every row lands in exactly one bin, whole. Uses first-fit decreasing, or first-fit in input
    order when that needs fewer bins, so the result never has more bins than first-fit. Rows
    inside a bin are in ascending input order; bins are in order of creation. A row longer than
    `capacity` raises InputError naming it.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int | np.integer) or capacity < 1:
        raise InputError(f"capacity must be a positive int, got {capacity!r}")
    items = list(rows_or_lengths)
    are_rows = bool(items) and isinstance(items[0], Row)
    if are_rows:
        lengths = np.asarray([len(r.input_ids) for r in items], dtype=np.int64)
    else:
        lengths = np.asarray(items, dtype=np.int64).reshape(-1)
        if (lengths < 0).any():
            raise InputError(f"lengths must be >= 0, got negatives at {name_some(np.flatnonzero(lengths < 0).tolist())}")
    too_long = np.flatnonzero(lengths > capacity).tolist()
    if too_long:
        names = [f"{items[i].rollout_id}#{i}" if are_rows else f"#{i}" for i in too_long]  # type: ignore[union-attr]
        raise InputError(
            f"{len(too_long)} rows are longer than the capacity {capacity} "
            f"({name_some([f'{n} ({lengths[i]} tokens)' for n, i in zip(names, too_long, strict=True)])}): "
            "raise the capacity or shorten the rows"
        )
    if len(lengths) == 0:
        return []
    ffd = _first_fit(np.argsort(-lengths, kind="stable"), lengths, capacity)
    ff = _first_fit(np.arange(len(lengths)), lengths, capacity)
    bin_of = ff if ff.max() < ffd.max() else ffd

    bins: list[PackedBin] = []
    for j in range(int(bin_of.max()) + 1):
        idx = np.flatnonzero(bin_of == j)
        lens = lengths[idx]
        cu = np.zeros(len(idx) + 1, np.int32)
        np.cumsum(lens, out=cu[1:])
        total = int(cu[-1])
        segment_ids = np.repeat(np.arange(len(idx), dtype=np.int32), lens)
        position_ids = np.arange(total, dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lens)
        input_ids = None
        if are_rows:
            parts = [np.asarray(items[i].input_ids, dtype=np.int64) for i in idx.tolist()]  # type: ignore[union-attr]
            input_ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        bins.append(PackedBin(idx.astype(np.int64), lens, cu, position_ids, segment_ids, input_ids))
    return bins


def pack_tokens(bins: Sequence[PackedBin], per_row: Sequence[Sequence[float] | np.ndarray]) -> list[np.ndarray]:
    """Concatenate per-row token arrays (weights, logprobs, loss masks) the way `bins` packed rows.

    `per_row[i]` belongs to input row i and must have that row's length (else InputError).
    """
    out = []
    for b in bins:
        parts = []
        for i, n in zip(b.row_indices.tolist(), b.lengths.tolist(), strict=True):
            a = np.asarray(per_row[i])
            if a.shape[:1] != (n,):
                raise InputError(f"array for row {i} has {a.shape[:1]} entries, the row has {n} tokens")
            parts.append(a)
        out.append(np.concatenate(parts) if parts else np.zeros(0))
    return out


def unpack_tokens(b: PackedBin, packed: np.ndarray) -> list[np.ndarray]:
    """Split a packed per-token array back into one array per row of the bin (bin order)."""
    return np.split(np.asarray(packed)[: b.length], b.cu_seqlens[1:-1])


def packed_attention_mask(b: PackedBin) -> torch.Tensor:
    """Boolean [L, L] mask, True where token q may attend to token k: same row and k <= q.

    Use it as `attn_mask` of `torch.nn.functional.scaled_dot_product_attention` together with
    `b.position_ids`; for varlen kernels use `b.cu_seqlens` instead.
    """
    import torch

    seg = torch.as_tensor(b.segment_ids, dtype=torch.int64)
    n = seg.shape[0]
    causal = torch.ones(n, n, dtype=torch.bool).tril_()
    return causal & (seg[:, None] == seg[None, :])
