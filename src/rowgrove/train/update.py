"""One policy update from rows: mini-batches of whole rollouts, packed micro-batches, the PPO-clip
loss on the engine's logprobs, gradient accumulation, one optimizer step per mini-batch.

The loss of one mini-batch is

    L = sum over rows i, positions t of  w[i][t] * l[i][t]
    l[i][t] = -min(ratio * A_i, clip(ratio, 1 - eps, 1 + eps) * A_i),  ratio = exp(logp - logp_engine)

where `w = rowgrove.algo.loss_weights(minibatch_rows, mode)` carries every divisor (token-mean:
1/T with T the generated tokens of valid rollouts in the mini-batch; rollout-mean: 1/(R T_r)).
Each micro-batch contributes its part of the sum and calls backward on it: no further division,
so gradient accumulation, packing and how many rows a rollout became leave the gradient unchanged.

Packed micro-batches use a varlen attention registered with transformers ("rowgrove_varlen"):
rows are concatenated, position ids restart per row and attention stays inside each row
(cu_seqlens), so no token sees another row and only attention pays for unequal row lengths. `packed=False` pads rows instead (the
benchmark's baseline); both give the same loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rowgrove.algo import loss_weights, minibatches, pack_rows
from rowgrove.errors import InputError, name_some
from rowgrove.types import Row

VARLEN = "rowgrove_varlen"
_registered = False


def _varlen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention inside each packed row. query [1, H, L, D], key/value [1, KVH, L, D];
    `cu_seq_lens_q` (int32 [K+1]) names the row boundaries. Returns [1, L, H, D].

    The rows are gathered into one [K, H, longest, D] batch for a single attention call (causal
    within a row, padded keys masked) and scattered back, so only attention pays for the rows'
    unequal lengths; every other layer runs on the packed tokens alone."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        raise InputError("rowgrove_varlen attention needs cu_seq_lens_q: call the model through microbatch_logits")
    starts, lengths = cu[:-1].long(), (cu[1:] - cu[:-1]).long()
    longest = int(lengths.max())
    offs = torch.arange(longest, device=query.device)
    real = offs[None, :] < lengths[:, None]                                   # [K, longest]
    gather = torch.where(real, starts[:, None] + offs[None, :], 0)           # [K, longest]

    def rows(x: torch.Tensor) -> torch.Tensor:                               # [1, H, L, D] -> [K, H, longest, D]
        return x[0][:, gather].transpose(0, 1)

    causal = torch.ones(longest, longest, dtype=torch.bool, device=query.device).tril()
    mask = causal[None, None] & real[:, None, None, :]                         # [K, 1, longest, longest]
    out = F.scaled_dot_product_attention(rows(query), rows(key), rows(value), attn_mask=mask, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2)[real][None].contiguous(), None               # [1, L, H, D]


def register_varlen() -> None:
    """Register the packed-row attention (and its no-op mask) with transformers, once."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, _varlen_attention)
    AttentionMaskInterface.register(VARLEN, lambda *args, **kwargs: None)
    _registered = True


def _use_attention(model: Any, name: str) -> None:
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module  # the attention setting lives on the wrapped model's config
    if model.config._attn_implementation != name:
        if name == VARLEN:
            register_varlen()
        model.set_attn_implementation(name)


def probe_logprobs(model: Any, ids: list[int]) -> list[float]:
    """The policy's log p(ids[i] | ids[:i]) for i >= 1, as the weight-sync check compares them with a
    server's (rowgrove.engines.verify): one plain forward with the standard attention, since the
    packed-sequence attention the update may have left set needs micro-batch boundaries."""
    from rowgrove.engines.verify import policy_logprobs

    _use_attention(model, "sdpa")
    return policy_logprobs(model, ids)


@dataclass
class MicroBatch:
    """Tensors for one forward pass, shape [B, L] (B = 1 when packed).

    Position t holds token t of its row; `target` is token t+1 (the token whose logprob the
    logits at t give), and `weight`, `old_logp`, `adv` belong to that target token. Weight is 0
    wherever the target is not trained (prompt, padding, a row's last position)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    target: torch.Tensor
    weight: torch.Tensor
    old_logp: torch.Tensor
    adv: torch.Tensor
    trained: torch.Tensor          # bool [B, L]: target is a loss-mask-1 token of a valid rollout
    cu_seqlens: torch.Tensor | None  # int32 [K+1] when packed
    attention_mask: torch.Tensor | None  # [B, L] when padded
    n_tokens: int                  # real (non-padding) tokens
    vision: dict[str, Any] | None = None  # a vision model's pixel inputs for the rows' images (model.vision)


def _shifted(row: Row, w_T: np.ndarray) -> tuple[np.ndarray, ...]:
    """(target, weight, old_logp, adv, trained) of one row, shifted so position t scores token t+1."""
    ids = np.asarray(row.input_ids, np.int64)
    mask = np.asarray(row.loss_mask) != 0
    if mask.size and mask[0]:
        raise InputError(f"row of rollout {row.rollout_id} has loss_mask 1 on its first token: "
                         "a trained token needs at least one token of context")
    if row.logprobs is None:
        raise InputError(f"row of rollout {row.rollout_id} has no logprobs: rows must carry the engine's logprobs")
    lp = np.asarray(row.logprobs, np.float64)
    if lp.shape != ids.shape:
        raise InputError(f"row of rollout {row.rollout_id}: {lp.size} logprobs for {ids.size} tokens")
    n = ids.size
    target = np.zeros(n, np.int64)
    target[:-1] = ids[1:]
    weight = np.zeros(n)
    weight[:-1] = w_T[1:]
    old = np.zeros(n)
    old[:-1] = lp[1:]
    trained = np.zeros(n, bool)
    trained[:-1] = mask[1:] & bool(row.valid)
    adv = np.full(n, float(row.advantage or 0.0))
    return target, weight, old, adv, trained


def build_microbatches(rows: Sequence[Row], weights: Sequence[np.ndarray], *, capacity: int,
                       packed: bool = True, device: str | torch.device = "cpu") -> list[MicroBatch]:
    """Micro-batches holding every row once, each at most `capacity` tokens (padding counted when
    not packed; a row longer than the capacity gets a micro-batch of its own)."""
    if not rows:
        return []
    lengths = [len(r.input_ids) for r in rows]
    cap = max(capacity, max(lengths))
    parts = [_shifted(r, np.asarray(w)) for r, w in zip(rows, weights, strict=True)]

    def t(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dtype, device=device)

    out = []
    if packed:
        for b in pack_rows(lengths, cap):
            idx = b.row_indices.tolist()
            cat = [np.concatenate([parts[i][k] for i in idx]) for k in range(5)]
            ids = np.concatenate([np.asarray(rows[i].input_ids, np.int64) for i in idx])
            out.append(MicroBatch(
                input_ids=t(ids, torch.long)[None], position_ids=t(b.position_ids, torch.long)[None],
                target=t(cat[0], torch.long)[None], weight=t(cat[1], torch.float32)[None],
                old_logp=t(cat[2], torch.float32)[None], adv=t(cat[3], torch.float32)[None],
                trained=t(cat[4], torch.bool)[None], cu_seqlens=t(b.cu_seqlens, torch.int32),
                attention_mask=None, n_tokens=b.length))
        return out
    # padded: rows in input order, as many per micro-batch as fit when padded to the longest
    groups: list[list[int]] = [[]]
    longest = 0
    for i, n in enumerate(lengths):
        if groups[-1] and max(longest, n) * (len(groups[-1]) + 1) > cap:
            groups.append([])
            longest = 0
        groups[-1].append(i)
        longest = max(longest, n)
    for g in groups:
        L = max(lengths[i] for i in g)
        arr = np.zeros((6, len(g), L))
        am = np.zeros((len(g), L), np.int64)
        ids = np.zeros((len(g), L), np.int64)
        for j, i in enumerate(g):
            n = lengths[i]
            ids[j, :n] = rows[i].input_ids
            am[j, :n] = 1
            for k in range(5):
                arr[k, j, :n] = parts[i][k]
            arr[5, j, :n] = np.arange(n)
        out.append(MicroBatch(
            input_ids=t(ids, torch.long), position_ids=t(arr[5], torch.long), target=t(arr[0], torch.long),
            weight=t(arr[1], torch.float32), old_logp=t(arr[2], torch.float32), adv=t(arr[3], torch.float32),
            trained=t(arr[4], torch.bool), cu_seqlens=None, attention_mask=t(am, torch.long),
            n_tokens=sum(lengths[i] for i in g)))
    return out


def row_microbatches(rows: Sequence[Row], weights: Sequence[np.ndarray], vision_inputs: Any, *,
                     device: str | torch.device = "cpu") -> list[MicroBatch]:
    """One padded micro-batch per row, carrying `vision_inputs(row)` (None for a row without
    images): a vision model's images go with their own row. The loss is a weighted sum, so how
    rows are grouped into micro-batches never changes the gradient."""
    out = []
    for row, w in zip(rows, weights, strict=True):
        (mb,) = build_microbatches([row], [w], capacity=len(row.input_ids), packed=False, device=device)
        mb.vision = vision_inputs(row) if row.images else None
        out.append(mb)
    return out


def microbatch_logits(model: Any, mb: MicroBatch) -> torch.Tensor:
    """Logits [n, V] at the micro-batch's trained positions (in row-major order of `mb.trained`)."""
    keep = mb.trained.any(dim=0).nonzero().squeeze(-1)  # positions trained in any row
    if mb.vision is not None:
        # a vision model recomputes its image features from the pixels; its 3-D rotary positions
        # come from the ids and image grids, so no position_ids are passed
        from rowgrove.model.vision import model_kwargs

        _use_attention(model, "sdpa")
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, logits_to_keep=keep,
                       use_cache=False, **model_kwargs(mb.input_ids, mb.vision)).logits
        return logits[mb.trained[:, keep]]
    if mb.cu_seqlens is not None:
        _use_attention(model, VARLEN)
        cu = mb.cu_seqlens
        longest = int((cu[1:] - cu[:-1]).max())
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                       max_length_q=longest, max_length_k=longest, logits_to_keep=keep, use_cache=False).logits
    else:
        _use_attention(model, "sdpa")
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, attention_mask=mb.attention_mask,
                       logits_to_keep=keep, use_cache=False).logits
    sel = mb.trained[:, keep]  # [B, K]
    return logits[sel]


def ppo_clip_loss(model: Any, mb: MicroBatch, clip_eps: float, *, ref_model: Any = None,
                  kl_coef: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """(sum of weight * PPO-clip loss over the micro-batch's trained tokens, sums for metrics).

    With `ref_model` and `kl_coef` > 0 each trained token also pays kl_coef * k3(policy || ref)
    (GRPO's KL penalty to the starting policy, k3 = exp(r) - r - 1 with r = logp_ref - logp),
    weighted by the same w, so the penalty has the loss's divisors and no others.

    Metric sums (divide by `tokens` for means): clipped (tokens whose ratio left the clip range
    on the side that stops the gradient), kl (k3 estimator of KL(engine || policy)), entropy,
    ref_kl (k3 of KL(policy || ref), 0 without a reference)."""
    logits = microbatch_logits(model, mb).float()
    keep = mb.trained.any(dim=0).nonzero().squeeze(-1)
    sel = mb.trained[:, keep]
    target = mb.target[:, keep][sel]
    w = mb.weight[:, keep][sel]
    old = mb.old_logp[:, keep][sel]
    adv = mb.adv[:, keep][sel]
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, target[:, None]).squeeze(-1)
    log_ratio = logp - old
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    loss = -(w * torch.minimum(unclipped, clipped)).sum()
    ref_kl = torch.zeros(())
    if ref_model is not None and kl_coef > 0:
        with torch.no_grad():
            ref_logp = torch.log_softmax(microbatch_logits(ref_model, mb).float(), -1).gather(-1, target[:, None]).squeeze(-1)
        r = ref_logp - logp
        k3 = torch.exp(r) - r - 1
        loss = loss + kl_coef * (w * k3).sum()
        ref_kl = k3.detach().sum()
    with torch.no_grad():
        stats = {
            "tokens": float(target.numel()),
            "clipped": float((clipped < unclipped).sum()),
            "kl": float(((ratio - 1) - log_ratio).sum()),
            "entropy": float(-(logp_all.exp() * logp_all).sum(-1).sum()),
            "ref_kl": float(ref_kl),
        }
    return loss, stats


def update_policy(model: Any, optimizer: torch.optim.Optimizer, rows: Sequence[Row] | None, *, loss_mode: str = "token-mean",
                  rollouts_per_minibatch: int = 32, microbatch_tokens: int = 4096, clip_eps: float = 0.2,
                  seed: int = 0, packed: bool = True, max_grad_norm: float = 1.0,
                  scheduler: Any = None, ref_model: Any = None, kl_coef: float = 0.0,
                  vision_inputs: Any = None, weight_fn: Any = None, dp: Any = None) -> dict[str, float]:
    """Train `model` on rows that carry advantages: one optimizer step per mini-batch of whole
    rollouts (`rowgrove.algo.minibatches(rows, rollouts_per_minibatch, seed=seed)`), whatever the
    row count. Returns mean metrics over trained tokens: loss (sum over updates), clip_fraction,
    approx_kl, entropy, ref_kl, tokens_trained, updates. `ref_model`/`kl_coef`: see ppo_clip_loss.
    `vision_inputs(row)`: a vision model's pixel inputs for a row with images (`row_microbatches`).
    `weight_fn(minibatch_rows, loss_mode)` replaces `loss_weights` (a benchmark's defect; None: rowgrove's).

    `dp` (a `rowgrove.train.parallel.DataParallel`, every rank calls this together): rank 0 passes
    the step's rows, the others None; each mini-batch's rows are dealt to the ranks, the divisors
    are all-reduced (`loss_weights(..., counts=)`) and so are the gradients (summed), so the
    update equals the one-process update on all the rows. Metrics are summed over the ranks."""
    rows = list(rows or [])
    missing = [r.rollout_id for r in rows if r.valid and r.advantage is None]
    if missing:
        raise InputError(f"{len(missing)} valid rows have no advantage ({name_some(missing)}): "
                         "run rowgrove.algo.assign_advantages first")
    device = next(model.parameters()).device
    model.train()
    totals = {"tokens": 0.0, "clipped": 0.0, "kl": 0.0, "entropy": 0.0, "ref_kl": 0.0}
    loss_total = 0.0
    net = model if dp is None else dp.ddp
    if dp is None:
        mbs = [(mb, None) for mb in minibatches(rows, rollouts_per_minibatch, seed=seed)]
    else:
        mbs = [(s.rows, dp.global_counts(s)) for s in dp.scatter_minibatches(rows if dp.is_main else None,
                                                                              rollouts_per_minibatch, seed)]
    for mb_rows, counts in mbs:
        weights = loss_weights(mb_rows, loss_mode, counts=counts) if weight_fn is None else weight_fn(mb_rows, loss_mode)
        optimizer.zero_grad(set_to_none=True)
        accumulate = contextlib.ExitStack()  # data parallel: backward passes only accumulate locally
        if dp is not None:
            accumulate.enter_context(dp.accumulate())
        micros = (row_microbatches(mb_rows, weights, vision_inputs, device=device) if vision_inputs is not None
                  else build_microbatches(mb_rows, weights, capacity=microbatch_tokens, packed=packed, device=device))
        for micro in micros:
            if not bool(micro.trained.any()):
                continue
            loss, stats = ppo_clip_loss(net, micro, clip_eps, ref_model=ref_model, kl_coef=kl_coef)
            loss.backward()
            loss_total += float(loss.detach())
            for k in totals:
                totals[k] += stats[k]
        accumulate.close()
        if dp is not None:
            dp.sync_gradients()  # then all ranks' gradients are summed
        if max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    if dp is not None:
        totals = dp.sum_stats({**totals, "loss": loss_total})
        loss_total = totals.pop("loss")
    n = max(totals["tokens"], 1.0)
    return {"loss": loss_total, "clip_fraction": totals["clipped"] / n, "approx_kl": totals["kl"] / n,
            "entropy": totals["entropy"] / n, "ref_kl": totals["ref_kl"] / n, "tokens_trained": totals["tokens"], "updates": float(len(mbs))}
