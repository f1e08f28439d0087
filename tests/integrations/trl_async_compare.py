"""rowgrove's rows against AsyncGRPO's built-in harness path, on the same recorded rollouts
(trl_async_rollouts: a compaction agent on the real Qwen3 template). Prints the table of
docs/integrations.md ("TRL AsyncGRPO"):

    OMP_NUM_THREADS=1 .venv/bin/python tests/integrations/trl_async_compare.py

AsyncGRPO's path, run with its own code: each call's request messages re-rendered and
re-tokenized as its harness worker does (`tokenizer.apply_chat_template(messages, tools=...,
add_generation_prompt=True)`, openenv_harness._HarnessRolloutLoop._sample_turn), one `TurnRecord`
per call with the tokens and logprobs the engine sampled, then `_chain_to_sequences` (its fork /
realign reconciler) at the default `fork_threshold_tokens=1024` and at 0 (the harness worker's
lossless capture). Samples carry one advantage per conversation, as `_score_group` stamps it.
Both paths then go through AsyncGRPO's own `FixedCountBatcher` and `DataCollatorForRollout`; the
weight of each trained token is read off the collated batch as its loss divides it
(`advantages / global_n_tokens / gradient_accumulation_steps`, async_grpo_trainer.compute_loss).

AsyncGRPOTrainer itself does not run on this CPU: its tree attention calls a FlashAttention-3
kernel (packing._flash_attn, `kernels`), GPU only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trl.experimental.async_grpo.async_grpo_trainer import DataCollatorForRollout, FixedCountBatcher
from trl.experimental.async_grpo.async_rollout_worker import TurnRecord, _chain_to_sequences

from rowgrove.integrations.trl_async import rows_to_samples
from rowgrove.integrations.weighting import weigh_rows

MICROBATCH = 4
LOGPROB_TOL = 1e-4


@dataclass
class Seq:
    rollout_id: str
    input_ids: list[int]
    mask: list[int]
    old_logprobs: list[float]


def engine_prompts(calls: list[Any]) -> dict[str, list[int]]:
    """call id -> the full prompt the engine was given (a continuation: its parent's prompt and
    sampled ids, then the part it added)."""
    full: dict[str, list[int]] = {}
    by_id = {c.id: c for c in calls}
    for c in calls:
        if c.root:
            full[c.id] = [int(t) for t in c.prompt_ids]
        else:
            p = by_id[c.parent_id]
            full[c.id] = full[p.id] + [int(t) for t in p.sampled_ids] + [int(t) for t in c.prompt_ids]
    return full


def trl_turns(requests: list[list[dict[str, Any]]], calls: list[Any], tokenizer: Any, tools: Any) -> list[TurnRecord]:
    """The TurnRecords AsyncGRPO's harness worker builds: its own rendering of each request, the
    engine's sampled ids and logprobs."""
    turns = []
    for messages, call in zip(requests, calls, strict=True):
        # an SDK tool-call turn has no content; Qwen3's template needs one ("" as vLLM passes it)
        messages = [{**m, "content": m.get("content") or ""} for m in messages]
        prompt_ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)
        turns.append(TurnRecord(list(prompt_ids), [int(t) for t in call.sampled_ids],
                                [float(x) for x in call.logprobs]))
    return turns


def trl_sequences(recorded: Any, tokenizer: Any, tools: Any, fork_threshold: int) -> tuple[list[Seq], dict[str, float]]:
    seqs: list[Seq] = []
    tally_all = {"clean": 0.0, "realign": 0.0, "fork": 0.0}
    for rid, trace in recorded.traces.items():
        turns = trl_turns(trace.requests, recorded.calls[rid], tokenizer, tools)
        out, tally = _chain_to_sequences(turns, rid, fork_threshold)
        for k in tally_all:
            tally_all[k] += tally[k]
        seqs += [Seq(rid, s.input_ids, s.completion_mask, s.old_log_probs) for s in out]
    return seqs, tally_all


def rowgrove_sequences(recorded: Any) -> list[Seq]:
    return [Seq(r.rollout_id, list(r.input_ids), [int(m != 0) for m in r.loss_mask], list(r.logprobs))
            for r in recorded.rows]


def context_mismatch(seqs: list[Seq], recorded: Any) -> int:
    """Trained tokens whose context in the sequence is not what the engine was given when it
    sampled them (its prompt, then the tokens it had sampled before them in that call)."""
    bad = 0
    for s in seqs:
        calls = recorded.calls[s.rollout_id]
        prompts = engine_prompts(calls)
        exact = np.zeros(len(s.input_ids), bool)
        for c in calls:
            p, got = prompts[c.id], [int(t) for t in c.sampled_ids]
            if s.input_ids[:len(p)] == p and s.input_ids[len(p):len(p) + len(got)] == got:
                exact[len(p):len(p) + len(got)] = True
        bad += int(np.count_nonzero(np.asarray(s.mask, bool) & ~exact))
    return bad


def logprob_mismatch(seqs: list[Seq], model: Any) -> int:
    """Trained tokens whose old logprob is not the policy's logprob of that token in the training
    context (same weights as the sampler: the scripted engine reports the model's own), > LOGPROB_TOL."""
    import torch

    bad = 0
    with torch.no_grad():
        for s in seqs:
            ids = torch.tensor([s.input_ids])
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            lp = logp.gather(1, ids[0, 1:, None])[:, 0].numpy()
            mask = np.asarray(s.mask[1:], bool)
            bad += int(np.count_nonzero(np.abs(lp - np.asarray(s.old_logprobs[1:], np.float64))[mask] > LOGPROB_TOL))
    return bad


def collate_weights(samples: list[dict[str, Any]], microbatch: int) -> dict[str, float]:
    """Per rollout: the summed weight AsyncGRPO's loss puts on its tokens per unit of advantage,
    all samples in one optimizer step (G = number of micro-batches), read off its own collator."""
    n_mb = math.ceil(len(samples) / microbatch)
    out: dict[str, float] = {}
    for rows in FixedCountBatcher(samples, 1, microbatch):
        batch = DataCollatorForRollout(pad_token_id=0)([rows])
        adv = batch["advantages"][0].numpy().astype(np.float64)
        seg = batch["segment_id"][0].numpy()
        sel = batch["token_index"][0].numpy() >= 0
        coef = adv[sel] / float(batch["global_n_tokens"][0]) / n_mb
        for i, sample in enumerate(rows[0].samples):
            if sample["rollout_id"] is None:
                continue
            a = sample["rollout_advantage"]
            if a != 0:
                out[sample["rollout_id"]] = out.get(sample["rollout_id"], 0.0) + float(coef[seg[sel] == i].sum()) / a
    return out


def _sample_dict(ids, mask, lp, adv, group, rollout_id, rollout_adv) -> dict[str, Any]:
    return {"input_ids": np.asarray(ids, np.int64), "completion_mask": np.asarray(mask, np.int64),
            "old_log_probs": np.asarray(lp, np.float32), "advantage": float(adv), "group_id": group,
            "metrics": {}, "rollout_id": rollout_id, "rollout_advantage": rollout_adv}


def trl_samples(seqs: list[Seq], recorded: Any) -> list[dict[str, Any]]:
    """AsyncGRPO's samples: one advantage per conversation, (r - mean) / (std + 1e-8) over its
    group, on every sequence it became (_AsyncRolloutLoop._score_group)."""
    rewards = {r.rollout_id: (r.group_id, float(r.reward)) for r in recorded.rows}
    by_group: dict[str, list[float]] = {}
    for g, r in rewards.values():
        by_group.setdefault(g, []).append(r)
    adv = {rid: (r - np.mean(by_group[g])) / (np.std(by_group[g]) + 1e-8) for rid, (g, r) in rewards.items()}
    groups = {g: i for i, g in enumerate(by_group)}
    return [_sample_dict(s.input_ids, s.mask, s.old_logprobs, adv[s.rollout_id], groups[rewards[s.rollout_id][0]],
                         s.rollout_id, adv[s.rollout_id]) for s in seqs]


def rowgrove_samples(recorded: Any, microbatch: int) -> list[dict[str, Any]]:
    """The worker's samples (rows_to_samples), one optimizer step of G = rows / microbatch."""
    rows = recorded.rows
    g = math.ceil(len(rows) / microbatch)
    samples = rows_to_samples(rows, microbatch_size=microbatch, gradient_accumulation_steps=g)
    weighted = weigh_rows(rows)
    adv = {w.row.rollout_id: float(w.row.advantage) for w in weighted.rows}
    rids = [w.row.rollout_id for w in weighted.rows] + [None] * (len(samples) - len(weighted.rows))
    return [_sample_dict(s.input_ids, s.completion_mask, s.old_log_probs, s.advantage, s.group_id, rid,
                         adv.get(rid, 0.0)) for s, rid in zip(samples, rids, strict=True)]


def rowgrove_shares(recorded: Any) -> dict[str, float]:
    """rowgrove's weight per rollout (token-mean): the sum of its tokens' loss weights."""
    weighted = weigh_rows(recorded.rows)
    out: dict[str, float] = {}
    for w in weighted.rows:
        out[w.row.rollout_id] = out.get(w.row.rollout_id, 0.0) + float(w.weight_T.sum())
    return out


def compare(recorded: Any, tokenizer: Any, model: Any, tools: Any, microbatch: int = MICROBATCH) -> dict[str, dict[str, Any]]:
    """The figures of the table, per path."""
    sampled = sum(len(c.sampled_ids) for cs in recorded.calls.values() for c in cs)
    target = rowgrove_shares(recorded)
    figures: dict[str, dict[str, Any]] = {}
    paths: list[tuple[str, list[Seq], dict[str, float] | None]] = [("rowgrove", rowgrove_sequences(recorded), None)]
    for thr in (1024, 0):
        seqs, tally = trl_sequences(recorded, tokenizer, tools, thr)
        paths.append((f"AsyncGRPO fork_threshold_tokens={thr}", seqs, tally))
    for name, seqs, tally in paths:
        trained = sum(int(np.count_nonzero(s.mask)) for s in seqs)
        samples = rowgrove_samples(recorded, microbatch) if tally is None else trl_samples(seqs, recorded)
        shares = collate_weights(samples, microbatch)
        dev = max(abs(shares.get(r, 0.0) - t) / t for r, t in target.items())
        figures[name] = {
            "rollouts": len(recorded.traces),
            "sequences": len(seqs),
            "sequences_per_rollout": sorted({sum(1 for s in seqs if s.rollout_id == r) for r in recorded.traces}),
            "sampled_tokens": sampled,
            "trained_tokens": trained,
            "sampled_not_trained": sampled - trained,
            "context_differs": context_mismatch(seqs, recorded),
            "old_logprob_differs": logprob_mismatch(seqs, model),
            "transitions": tally,
            "max_rollout_weight_deviation": dev,
            "samples": len(samples),
        }
    return figures


def table(figures: dict[str, dict[str, Any]]) -> str:
    head = ("| path | sequences (per rollout) | trained / sampled tokens | sampled, not trained | trained tokens "
            "whose context is not the engine's | trained tokens whose old logprob is not the policy's "
            f"(> {LOGPROB_TOL:g}) | largest deviation of a rollout's weight from rowgrove's token-mean |")
    lines = [head, "|" + "---|" * 7]
    for name, f in figures.items():
        per = "/".join(str(x) for x in f["sequences_per_rollout"])
        lines.append(f"| {name} | {f['sequences']} ({per}) | {f['trained_tokens']} / {f['sampled_tokens']} | "
                     f"{f['sampled_not_trained']} | {f['context_differs']} | {f['old_logprob_differs']} | "
                     f"{f['max_rollout_weight_deviation']:.1%} |")
    return "\n".join(lines)


def main() -> None:
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here.parent), str(here)]
    import torch
    from families import family_model_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl_async_rollouts as R
    from rowgrove.gateway.testing import start_gateway

    torch.set_num_threads(1)
    folder = family_model_dir("qwen3")
    with start_gateway(str(folder), engine="scripted") as gw:
        recorded = R.record(gw)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    figures = compare(recorded, tok, model, R.TOOLS)
    print(table(figures))
    for name, f in figures.items():
        print(name, {k: f[k] for k in ("transitions", "samples")})


if __name__ == "__main__":
    main()
