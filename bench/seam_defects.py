"""The known seam defects, switched on one at a time, and what each costs on the same rows.

Bench-only on purpose: nothing here is, or may become, part of `rowgrove.algo`. Each defect is a
public bug some framework shipped at the seam between a rollout and its training rows:

    row_baseline      baseline over rows: each row votes in its group's mean       (NeMo RL PR #4124)
    reshape_groups    groups by positional reshape of a flat reward vector, one
                      batch-wide group when the sizes are uneven                    (slime PR #2204)
    row_divisor       per-rollout loss divided by rows, not rollouts                (agent-lightning v1.0 report, Eq. 16)
    seq_mean_rows     sequence-level mean over rows for multi-row rollouts          (seq-mean-token-mean on split rollouts)
    retokenized       trained tokens re-tokenized from the text, not the sampled ids: the
                      harness's accepted message rendered again by the chat template
    rejected_trained  rejected (resampled) calls trained with the rollout's advantage

The figures compare a defect's rows, advantages and weights with rowgrove's on the same rows.
A rollout's *signal* is the sum over its rows of advantage x weight, the weight being the loss
weight its tokens carry in the step (all the step's rows taken as one batch):

    wrong_sign          fraction of rollouts whose signal's sign (-1, 0, +1) differs from the sign
                        of rowgrove's advantage (a uniform group's 0 made non-zero counts)
    mass_ratio          sum over rollouts of |signal|, as a ratio to rowgrove's
    relative_weight     per rollout: weight x R (R = rollouts), so 1.0 is an equal share

Pure: rows in, numbers out; the tokenizer is the only object passed in (for `retokenize_rows`).
Shapes in names: `_R` per rollout, `_N` per row, `_T` per token.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rowgrove.algo import assign_advantages, loss_weights
from rowgrove.types import Call, Row

DEFECTS: dict[str, str] = {
    "row_baseline": "baseline over rows (each row votes in its group's mean; NeMo RL PR #4124)",
    "reshape_groups": "groups by positional reshape of the flat reward vector, batch-wide when sizes are "
                      "uneven (slime PR #2204)",
    "row_divisor": "per-rollout loss divided by rows, not rollouts (agent-lightning v1.0 report, Eq. 16)",
    "seq_mean_rows": "sequence-level mean over rows for multi-row rollouts (seq-mean-token-mean)",
    "retokenized": "trained tokens re-tokenized from the text (the accepted message rendered again by the chat "
                   "template) instead of the sampled ids",
    "rejected_trained": "rejected (resampled) calls trained with the rollout's advantage",
}
SEAMS = ("rowgrove", *DEFECTS)

_ZERO = 1e-12  # |x| at or below this is sign 0: rowgrove's uniform groups are exactly 0


# ---- defects 1 and 2: advantages ----------------------------------------------------------------

def row_baseline_advantages(rows: Sequence[Row], *, estimator: str = "grpo", scale_by_std: bool = True) -> list[Row]:
    """Rows with advantages computed as if every row were a rollout of its group: a rollout cut
    into k rows puts its reward k times into its group's mean (and std). Rowgrove's own code does
    the arithmetic; the defect is only in what it is told a rollout is."""
    split = [dataclasses.replace(r, rollout_id=f"{r.rollout_id}\x00{i}") for i, r in enumerate(rows)]
    out = assign_advantages(split, estimator=estimator, scale_by_std=scale_by_std)
    return [dataclasses.replace(o, rollout_id=r.rollout_id) for o, r in zip(out, rows, strict=True)]


def reshape_advantages(rows: Sequence[Row], *, group_size: int, n_groups: int, estimator: str = "grpo",
                       scale_by_std: bool = True) -> list[Row]:
    """Rows with advantages from a flat per-row reward vector cut by position, the way slime's
    `_post_process_rewards` did before PR #2204: `view(-1, group_size)` when the vector holds
    exactly `group_size * n_groups` rewards, else `view(-1, total)`, one batch-wide group.
    Rows of invalid rollouts are left out of the vector and get 0 (as rowgrove masks them)."""
    from rowgrove.algo import group_advantages

    live = [i for i, r in enumerate(rows) if r.valid]
    rewards_N = np.asarray([float(rows[i].reward) for i in live], np.float64)
    n = len(live)
    if n == group_size * n_groups:
        adv_N = group_advantages(rewards_N, None, group_size=group_size, estimator=estimator,
                                 scale_by_std=scale_by_std)
    else:  # the fallback: one group spanning the batch
        adv_N = group_advantages(rewards_N, ["batch"] * n, estimator=estimator, scale_by_std=scale_by_std)
    adv = [0.0] * len(rows)
    for i, a in zip(live, adv_N.tolist(), strict=True):
        adv[i] = a
    return [dataclasses.replace(r, advantage=a) for r, a in zip(rows, adv, strict=True)]


# ---- defects 3 and 4: loss weights ----------------------------------------------------------------

def _masks(rows: Sequence[Row]) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """(mask_T per row as float, rollout index per row, generated tokens per row), invalid rows 0."""
    index: dict[str, int] = {}
    rollout_N = np.asarray([index.setdefault(r.rollout_id, len(index)) for r in rows], np.intp)
    masks = [(np.asarray(r.loss_mask) != 0).astype(np.float64) * bool(r.valid) for r in rows]
    gen_N = np.asarray([m.sum() for m in masks], np.float64)
    return masks, rollout_N, gen_N


def row_divisor_weights(rows: Sequence[Row], mode: str = "rollout-mean") -> list[np.ndarray]:
    """rollout-mean with the wrong divisor: 1 / (N * T_rollout), N = rows with a generated token
    instead of R = rollouts. Each rollout keeps R/N of its mass. `mode` is ignored (the defect is
    the divisor of rollout-mean)."""
    masks, rollout_N, gen_N = _masks(rows)
    gen_R = np.bincount(rollout_N, weights=gen_N) if len(rows) else np.zeros(0)
    n_rows = int((gen_N > 0).sum())
    if not n_rows:
        return [m * 0.0 for m in masks]
    per_N = np.divide(1.0, n_rows * gen_R[rollout_N], out=np.zeros(len(rows)), where=gen_N > 0)
    return [m * s for m, s in zip(masks, per_N.tolist(), strict=True)]


def seq_mean_weights(rows: Sequence[Row], mode: str = "rollout-mean") -> list[np.ndarray]:
    """seq-mean-token-mean without rowgrove's refusal: every row weighs 1 / N (N = rows with a
    generated token), shared by its own tokens, so a rollout cut into k rows weighs k / N."""
    masks, _, gen_N = _masks(rows)
    n_rows = int((gen_N > 0).sum())
    if not n_rows:
        return [m * 0.0 for m in masks]
    per_N = np.divide(1.0, n_rows * gen_N, out=np.zeros(len(rows)), where=gen_N > 0)
    return [m * s for m, s in zip(masks, per_N.tolist(), strict=True)]


# ---- defect 5: re-tokenized text ------------------------------------------------------------------

def _spans(mask_T: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of mask 1."""
    padded = np.concatenate([[0], (mask_T != 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def never_sampled(sampled: Sequence[int], retok: Sequence[int]) -> int:
    """Tokens of `retok` outside the longest matching blocks with `sampled` (difflib's alignment):
    ids the model would be trained on that it did not sample there."""
    sm = difflib.SequenceMatcher(None, list(sampled), list(retok), autojunk=False)
    return len(retok) - sum(b.size for b in sm.get_matching_blocks())


@dataclasses.dataclass
class Retokenized:
    """Rows whose trained spans were decoded and encoded again, and what that changed."""

    rows: list[Row]
    spans: list[tuple[int, int, int]]  # per trained span: (row index, start, end) in the new row
    orig_spans: list[tuple[int, int, int]]  # the same spans in the original rows
    never_sampled_tokens: int          # trained tokens of the new rows not sampled there
    changed_spans: int                 # spans whose ids changed
    trained_tokens: int                # trained tokens of the new rows


def template_text(tokenizer: Any, message: dict[str, Any]) -> str:
    """The assistant turn `message` as the chat template writes it, up to and including the
    template's end-of-turn token (`tokenizer.eos_token`): the text a trainer that keeps messages,
    not ids, tokenizes. Tool-call arguments are passed parsed, as vLLM and SGLang pass them."""
    import copy
    import json

    msg = copy.deepcopy(dict(message))
    for tc in msg.get("tool_calls") or []:
        args = tc.get("function", {}).get("arguments")
        if isinstance(args, str):
            try:
                tc["function"]["arguments"] = json.loads(args)
            except ValueError:
                pass
    head = [{"role": "user", "content": "x"}]
    base = tokenizer.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(head + [msg], tokenize=False)[len(base):]
    eot = tokenizer.eos_token or ""
    return text[: text.index(eot) + len(eot)] if eot and eot in text else text


def retokenize_rows(rows: Sequence[Row], tokenizer: Any,
                    text_of: Callable[[int, list[int]], str] | None = None) -> Retokenized:
    """Each trained span (a run of loss-mask 1: one call's sampled tokens) replaced by
    `tokenizer.encode(text)`, the text path a framework takes when it keeps text and tokenizes it
    again. `text_of(row index, sampled ids)` gives the text kept for a span (default: the ids
    decoded). Prompts stay; logprobs of the new spans are 0 (the engine never scored them: a
    trainer must recompute them)."""
    out, spans, orig, never, changed, trained = [], [], [], 0, 0, 0
    for i, r in enumerate(rows):
        ids_T = np.asarray(r.input_ids, np.int64)
        mask_T = np.asarray(r.loss_mask)
        lp_T = np.asarray(r.logprobs if r.logprobs is not None else np.zeros(len(ids_T)), np.float64)
        pieces: list[tuple[np.ndarray, int, np.ndarray]] = []  # (ids, mask value, logprobs)
        pos = length = 0
        for a, b in _spans(mask_T):
            pieces.append((ids_T[pos:a], 0, lp_T[pos:a]))  # the prompt part before the span stays
            length += a - pos
            sampled = ids_T[a:b].tolist()
            text = text_of(i, sampled) if text_of else tokenizer.decode(sampled, skip_special_tokens=False)
            new = tokenizer.encode(text, add_special_tokens=False)
            spans.append((i, length, length + len(new)))
            orig.append((i, a, b))
            never += never_sampled(sampled, new)
            changed += new != sampled
            trained += len(new)
            pieces.append((np.asarray(new, np.int64), 1, np.zeros(len(new))))
            length += len(new)
            pos = b
        pieces.append((ids_T[pos:], 0, lp_T[pos:]))
        out.append(dataclasses.replace(
            r, input_ids=np.concatenate([p[0] for p in pieces]).astype(np.int32),
            loss_mask=np.concatenate([np.full(len(p[0]), p[1], np.int32) for p in pieces]),
            logprobs=np.concatenate([p[2] for p in pieces]), weight_versions=None))
    return Retokenized(out, spans, orig, never, changed, trained)


# ---- defect 6: rejected calls trained -------------------------------------------------------------

def rejected_rows(rows: Sequence[Row], calls: Sequence[Call], accepted: Sequence[str]) -> list[Row]:
    """One extra row per completed call that the rollout rejected (a resample replaced it): its
    chain's tokens (root prompt, sampled, new part, ..., its own sampled ids), loss mask 1 on its
    own sampled ids, the rollout's reward, advantage and validity copied from `rows[0]`. What a
    trainer does that trains every sample the engine returned."""
    if not rows:
        return []
    head = rows[0]
    by_id = {c.id: c for c in calls}
    keep = set(accepted)
    out = []
    for c in sorted(calls, key=lambda c: c.ordinal):
        if c.status != "completed" or c.id in keep or not len(c.sampled_ids):
            continue
        chain, cid = [], c.id
        while cid is not None and cid in by_id:
            chain.append(by_id[cid])
            cid = by_id[cid].parent_id
        chain.reverse()
        pieces, lps = [], []
        for x in chain:
            pieces += [np.asarray(x.prompt_ids), np.asarray(x.sampled_ids)]
            lps += [np.zeros(len(x.prompt_ids)), np.asarray(x.logprobs, np.float64)]
        n_own = len(c.sampled_ids)
        ids = np.concatenate(pieces).astype(np.int32)
        mask = np.zeros(len(ids), np.int32)
        mask[len(ids) - n_own:] = 1
        lp = np.concatenate(lps) * np.concatenate([np.zeros(len(ids) - n_own), np.ones(n_own)])
        out.append(dataclasses.replace(head, input_ids=ids, loss_mask=mask, logprobs=lp, segment=-1,
                                       call_ids=[x.id for x in chain], weight_versions=None))
    return out


# ---- figures ------------------------------------------------------------------------------------

def rollout_signal(rows: Sequence[Row], weights: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(rollout ids in first-seen order, signal_R = sum over rows of advantage x row weight,
    weight_R = sum of the rollout's token weights). Invalid rows count 0."""
    index: dict[str, int] = {}
    for r in rows:
        index.setdefault(r.rollout_id, len(index))
    signal_R = np.zeros(len(index))
    weight_R = np.zeros(len(index))
    for r, w_T in zip(rows, weights, strict=True):
        k = index[r.rollout_id]
        w = float(np.asarray(w_T).sum()) if r.valid else 0.0
        weight_R[k] += w
        signal_R[k] += float(r.advantage or 0.0) * w
    return list(index), signal_R, weight_R


def _sign(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) <= _ZERO, 0, np.sign(x)).astype(int)


def compare(reference: Sequence[Row], ref_weights: Sequence[np.ndarray], rows: Sequence[Row],
            weights: Sequence[np.ndarray]) -> dict[str, Any]:
    """The figures of one seam's rows and weights against rowgrove's on the same rollouts.

    Returns wrong_sign (fraction of rollouts rowgrove trains, sign of the signal differs from the
    sign of rowgrove's advantage), flipped (of those, rowgrove's is non-zero), spurious (rowgrove's
    is 0, the seam's is not), mass_ratio (sum |signal| over rowgrove's), weight_cv (std/mean of the
    rollouts' weights), relative_weight_by_rows ({rows per rollout: mean of weight x R}), and
    rollouts (R). mass_ratio is None when rowgrove's mass is 0 (no trained rollout, or only uniform
    groups)."""
    ids, sig_ref, w_ref = rollout_signal(reference, ref_weights)
    adv_ref = np.zeros(len(ids))
    pos = {rid: k for k, rid in enumerate(ids)}
    n_rows = np.zeros(len(ids), int)
    for r in reference:
        adv_ref[pos[r.rollout_id]] = float(r.advantage or 0.0) if r.valid else 0.0
        n_rows[pos[r.rollout_id]] += 1
    ids2, sig, w = rollout_signal(rows, weights)
    order = np.asarray([ids2.index(rid) if rid in ids2 else -1 for rid in ids], dtype=int)  # int even when empty
    sig = np.where(order >= 0, sig[order], 0.0)
    w = np.where(order >= 0, w[order], 0.0)
    live = w_ref > 0  # rollouts rowgrove trains
    R = int(live.sum())
    s_ref, s = _sign(adv_ref[live]), _sign(sig[live])
    wrong = s != s_ref
    mass_ref = float(np.abs(sig_ref).sum())
    rel = w[live] * R
    by_rows = {int(k): float(rel[n_rows[live] == k].mean()) for k in sorted(set(n_rows[live].tolist()))}
    return {
        "rollouts": R,
        "wrong_sign": float(wrong.mean()) if R else 0.0,
        "flipped": float((wrong & (s_ref != 0)).mean()) if R else 0.0,
        "spurious": float((wrong & (s_ref == 0)).mean()) if R else 0.0,
        "mass_ratio": float(np.abs(sig).sum()) / mass_ref if mass_ref > 0 else None,
        "weight_cv": float(rel.std() / rel.mean()) if R and rel.mean() > 0 else 0.0,
        "relative_weight_by_rows": by_rows,
    }


WeightFn = Callable[[Sequence[Row], str], list[np.ndarray]]


def weight_fn(seam: str) -> WeightFn:
    """The loss-weight function a seam trains with (rowgrove's `loss_weights` unless the defect
    is in the weights)."""
    if seam == "row_divisor":
        return row_divisor_weights
    elif seam == "seq_mean_rows":
        return seq_mean_weights
    elif seam in SEAMS:
        return loss_weights
    else:
        raise ValueError(f"unknown seam {seam!r}: use one of {', '.join(SEAMS)}")
