"""What each known seam defect costs, on the same rollouts, next to rowgrove's seam.

On the demo task (counter, keep_last_rounds compaction, resampling) the reference trainer runs
once per seed with rowgrove's seam; at every step, on that step's captured rows, each defect of
`seam_defects.DEFECTS` is switched on alone and its figures are taken against rowgrove's:
wrong-sign fraction, signal mass ratio, per-rollout weight against rows per rollout, trained
tokens never sampled (re-tokenized) or rejected (rejected calls trained), and the log-probability
gap between the engine's sampled tokens and the re-tokenized ones. Then the learning curves: the
same trainer, same seeds, run once with each defect switched on (reward per step).

All runs of a seed start from the same warmed model (the demo's supervised warm-up, done once),
sample step 1 with the same seeds (so step 1 is the same rollouts in every run), and differ only
in the seam from rows to loss, passed to `rowgrove.train.loop.train(seam=...)`.

    rowgrove bench seam [--quick] [--seeds N] [--out DIR]
    python bench/bench_seam.py [--quick] [--seeds N] [--out DIR] [--figures-only]

Writes bench/results/seam.json (not with --quick), and seam.json plus seam.html (a self-contained
page, plots inlined) to --out (default bench/results/ for a full run, runs/bench-seam for --quick).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # seam_defects, seam_report beside this file

import seam_defects as sd  # noqa: E402
from seam_report import write_page  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# Sizes: the demo's task, agent and optimizer (rowgrove.train.presets.DEMO), fewer prompts and
# steps per run (4 prompts x 4 rollouts, 4 steps) so that 7 seams x 2 seeds fit in about 15 to 30
# minutes on 2 shared cores.
# The warm-up is the demo's own (cached with `rowgrove demo`'s: the first run of either pays it).
FULL = {"steps": 4, "prompts_per_step": 4, "rollouts_per_prompt": 4, "rollouts_per_minibatch": 8}
QUICK = {"steps": 2, "prompts_per_step": 2, "rollouts_per_prompt": 4, "rollouts_per_minibatch": 4}


def base_config(quick: bool, **overrides: Any) -> Any:
    """The trainer config every run of the benchmark shares (seed and out are set per run)."""
    from rowgrove.train.config import TrainConfig
    from rowgrove.train.presets import DEMO

    return TrainConfig(**{**DEMO, **(QUICK if quick else FULL), "eval_prompts": 0, "checkpoint_every": 0,
                          "progress": False, "threads": 0, "concurrency": 32, **overrides})


# ---- the seams: rowgrove's and each defect's step from rows to loss ------------------------------

def policy_logprobs(model: Any, rows: Sequence[Any]) -> list[np.ndarray]:
    """Log-probability under `model` of every token of each row given the tokens before it (0 at
    the first position): the logprobs a trainer recomputes when the engine's do not fit its ids."""
    import torch

    if model.config._attn_implementation != "sdpa":
        model.set_attn_implementation("sdpa")
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for r in rows:
            ids = torch.as_tensor(np.asarray(r.input_ids, np.int64), device=device)[None]
            logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].float(), -1)
            lp = np.zeros(ids.shape[1])
            lp[1:] = logp.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu().numpy()
            out.append(lp)
    return out


def defect_rows(name: str, rows: list[Any], ref: list[Any], *, built: list[Any], ledger: Any, model: Any,
                tokenizer: Any, cfg: Any) -> tuple[list[Any], dict[str, Any]]:
    """The rows (with advantages) seam `name` trains on this step, and its own figures. `rows` are
    the step's rows as captured, `ref` the same with rowgrove's advantages."""
    import dataclasses

    adv = {"estimator": cfg.estimator, "scale_by_std": cfg.scale_by_std}
    if name == "rowgrove":
        return ref, {}
    elif name == "row_baseline":
        return sd.row_baseline_advantages(rows, **adv), {}
    elif name == "reshape_groups":
        return sd.reshape_advantages(rows, group_size=cfg.rollouts_per_prompt, n_groups=cfg.prompts_per_step,
                                     **adv), {}
    elif name in ("row_divisor", "seq_mean_rows"):
        return ref, {}  # the defect is in the weights (sd.weight_fn)
    elif name == "retokenized":
        rt = sd.retokenize_rows(ref, tokenizer, _record_text(ref, built, ledger, tokenizer))
        new_lp = policy_logprobs(model, rt.rows)
        # gap per trained span: engine logprob of the sampled ids - policy logprob of the re-tokenized ids
        gaps, changed = [], []
        for (i, a, b), (j, c, d) in zip(rt.orig_spans, rt.spans, strict=True):
            gaps.append(float(np.sum(np.asarray(ref[i].logprobs)[a:b])) - float(np.sum(new_lp[j][c:d])))
            changed.append(list(np.asarray(ref[i].input_ids)[a:b]) != list(np.asarray(rt.rows[j].input_ids)[c:d]))
        gap_changed = [g for g, ch in zip(gaps, changed, strict=True) if ch]
        out = [dataclasses.replace(r, logprobs=lp.astype(np.float32)) for r, lp in zip(rt.rows, new_lp, strict=True)]
        return out, {"never_sampled_tokens": rt.never_sampled_tokens, "trained_tokens": rt.trained_tokens,
                     "changed_span_fraction": rt.changed_spans / max(1, len(rt.spans)),
                     "logprob_gap_per_span": float(np.mean(gaps)) if gaps else 0.0,
                     "logprob_gap_per_changed_span": float(np.mean(gap_changed)) if gap_changed else None}
    elif name == "rejected_trained":
        from rowgrove.assemble import read_calls

        by_rollout: dict[str, list[Any]] = {}
        for r in ref:
            by_rollout.setdefault(r.rollout_id, []).append(r)
        accepted = {rr.rollout_id: rr.accepted for rr in built}
        extra = []
        for rid, its_rows in by_rollout.items():
            lid = _ledger_id(rid)
            extra += sd.rejected_rows(its_rows, read_calls(ledger, lid), accepted[lid])
        n_rej = int(sum(np.asarray(r.loss_mask).sum() for r in extra if r.valid))
        n_all = int(sum(np.asarray(r.loss_mask).sum() for r in ref if r.valid)) + n_rej
        return ref + extra, {"rejected_tokens_trained": n_rej, "trained_tokens": n_all}
    else:
        raise ValueError(f"unknown seam {name!r}: use one of {', '.join(sd.SEAMS)}")


def _ledger_id(row_rollout_id: str) -> str:
    """The ledger's rollout id of a trainer row (collect_rows prefixes it with the job's position)."""
    return row_rollout_id.rsplit(":", 1)[-1]


def _record_text(ref: list[Any], built: list[Any], ledger: Any, tokenizer: Any) -> Any:
    """`text_of` for seam_defects.retokenize_rows: a span's text is the record's message that the
    span's call was matched to (what the harness got back and sent to /finish), rendered again by
    the chat template; the decoded ids where no message matches."""
    from rowgrove.assemble import read_calls
    from rowgrove.assemble.select import record_conversations

    sampled: dict[tuple[str, ...], dict[str, Any]] = {}  # (rollout, sampled ids) -> message
    for rr in built:
        convs = record_conversations(ledger.get_rollout(rr.rollout_id).record)
        calls = {c.id: c for c in read_calls(ledger, rr.rollout_id)}
        for m in rr.matches:
            if m.call_id is not None and m.call_id in calls:
                sampled[(rr.rollout_id, *map(str, calls[m.call_id].sampled_ids.tolist()))] = convs[m.conversation][m.message]

    def text_of(i: int, ids: list[int]) -> str:
        msg = sampled.get((_ledger_id(ref[i].rollout_id), *map(str, ids)))
        return sd.template_text(tokenizer, msg) if msg is not None else tokenizer.decode(ids, skip_special_tokens=False)

    return text_of


def step_figures(rows: list[Any], built: list[Any], ledger: Any, model: Any, tokenizer: Any, cfg: Any
                 ) -> tuple[list[Any], dict[str, Any]]:
    """rowgrove's rows for this step and every defect's figures on them (see seam_defects)."""
    from rowgrove.algo import assign_advantages, loss_weights

    ref = assign_advantages(rows, estimator=cfg.estimator, scale_by_std=cfg.scale_by_std)
    w_ref = loss_weights(ref, cfg.loss_mode)
    figs: dict[str, Any] = {"rows_per_rollout": len(rows) / max(1, len(built)),
                            "rows_per_rollout_counts": _counts(ref)}
    for name in sd.DEFECTS:
        drows, own = defect_rows(name, rows, ref, built=built, ledger=ledger, model=model, tokenizer=tokenizer,
                                 cfg=cfg)
        f = sd.compare(ref, w_ref, drows, sd.weight_fn(name)(drows, cfg.loss_mode))
        if name == "rejected_trained":  # the share of the step's loss weight that sits on rejected tokens
            w = loss_weights(drows, cfg.loss_mode)
            f["rejected_weight_share"] = float(sum(x.sum() for x, r in zip(w, drows, strict=True) if r.segment == -1))
        figs[name] = {**f, **own}
    return ref, figs


def _counts(rows: list[Any]) -> dict[int, int]:
    """{rows per rollout: rollouts with that many}."""
    per: dict[str, int] = {}
    for r in rows:
        per[r.rollout_id] = per.get(r.rollout_id, 0) + 1
    out: dict[int, int] = {}
    for n in per.values():
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def make_seam(name: str, figures: list[dict[str, Any]] | None = None) -> Any:
    """The `seam` callable `train()` takes for seam `name`; with `figures`, each step's figures of
    every defect on rowgrove's rows are appended to it (the reference run)."""

    def seam(*, step: int, rows: list[Any], built: list[Any], ledger: Any, model: Any, tokenizer: Any,
             cfg: Any) -> tuple[list[Any], Any, dict[str, Any]]:
        from rowgrove.algo import assign_advantages

        if figures is not None:
            ref, figs = step_figures(rows, built, ledger, model, tokenizer, cfg)
            figures.append({"step": step, **figs})
        else:
            ref = assign_advantages(rows, estimator=cfg.estimator, scale_by_std=cfg.scale_by_std)
        out, own = defect_rows(name, rows, ref, built=built, ledger=ledger, model=model, tokenizer=tokenizer,
                               cfg=cfg)
        return out, sd.weight_fn(name), {f"seam_{k}": v for k, v in own.items()}

    return seam


# ---- runs ---------------------------------------------------------------------------------------

def run_seam(cfg: Any, name: str, seed: int, root: Path, figures: list[dict[str, Any]] | None = None
             ) -> list[dict[str, Any]]:
    """One training run with seam `name`; its metrics, one record per step."""
    from rowgrove.train.loop import train
    from rowgrove.train.report import read_metrics

    out = root / f"{name}-s{seed}"
    train(cfg.replace(seed=seed, out=str(out)), log=lambda *a: None, seam=make_seam(name, figures))
    return read_metrics(out)


def summarize(figures: dict[str, list[dict[str, Any]]], curves: dict[str, dict[str, list[float]]]
              ) -> dict[str, Any]:
    """Per defect: each figure's mean over steps and seeds; per seam: reward of the last step and
    mean of the last 3 steps (both averaged over seeds)."""
    out: dict[str, Any] = {}
    steps = [f for per_seed in figures.values() for f in per_seed]
    for name in sd.DEFECTS:
        keys = [k for k, v in steps[0][name].items() if not isinstance(v, dict)] if steps else []
        out[name] = {k: _mean([s[name][k] for s in steps]) for k in keys}
    for name, per_seed in curves.items():
        r = np.asarray(list(per_seed.values()), np.float64)  # [seeds, steps]
        out.setdefault(name, {})
        out[name]["reward_first_step"] = float(r[:, 0].mean())
        out[name]["reward_last_step"] = float(r[:, -1].mean())
        out[name]["reward_mean_last_3_steps"] = float(r[:, -3:].mean())
    return out


def _mean(xs: Sequence[float | None]) -> float | None:
    """Mean of the values that are numbers (a step without any trained rollout has no ratio)."""
    vals = [float(x) for x in xs if x is not None and np.isfinite(x)]
    return float(np.mean(vals)) if vals else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, short curves (a smoke check, not a measurement)")
    p.add_argument("--seeds", type=int, default=None, help="seeds per seam (default 2; 1 with --quick)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write seam.json and seam.html here (a full run always writes them to "
                        "bench/results; --quick only here, default runs/bench-seam)")
    p.add_argument("--figures-only", action="store_true", help="only the rowgrove runs and their figures, no curves")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 4; 2 with --quick)")
    args = p.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 2)
    if seeds < 1 or (args.steps is not None and args.steps < 1):
        p.error("--seeds and --steps must be at least 1")
    if args.out is None and args.quick:
        args.out = Path("runs/bench-seam")  # a smoke run's page goes beside the demo's runs, never into results
    t0 = time.time()
    from rowgrove.train.loop import prepare_model_dir

    cfg = base_config(args.quick, **({"steps": args.steps} if args.steps else {}))
    # one warm-up for every run: later runs start from its folder and skip their own
    start = prepare_model_dir(cfg.replace(seed=0), log=print)
    cfg = cfg.replace(model=str(start), warmup_sft_steps=0)
    figures: dict[str, list[dict[str, Any]]] = {}
    curves: dict[str, dict[str, list[float]]] = {name: {} for name in (sd.SEAMS[:1] if args.figures_only else sd.SEAMS)}
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-seam-") as tmp:
        for seed in range(seeds):
            for name in curves:
                t = time.time()
                figs = figures.setdefault(str(seed), []) if name == "rowgrove" else None
                recs = run_seam(cfg, name, seed, Path(tmp), figs)
                curves[name][str(seed)] = [r["reward_mean"] for r in recs]
                print(f"seed {seed} {name:17s} reward per step {' '.join(f'{x:.3f}' for x in curves[name][str(seed)])}"
                      f"  ({time.time() - t:.0f}s)", flush=True)
    seconds = time.time() - t0
    result = {
        "benchmark": "seam: what each known seam defect costs, on the same rollouts as rowgrove's seam",
        "command": "rowgrove bench seam " + " ".join(shlex.quote(a) for a in (argv or [])),
        "quick": args.quick, "seeds": seeds, "seconds": seconds,
        "config": {k: v for k, v in cfg.to_dict().items() if k not in ("out", "model")},
        "model": "tiny-task after the demo's warm-up (seed 0), shared by every run",
        "defects": sd.DEFECTS,
        "figures": figures, "curves": curves, "summary": summarize(figures, curves),
    }
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "seam.json").write_text(json.dumps(result, indent=1) + "\n")
        write_page(result, RESULTS / "seam.html")
    out = args.out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "seam.json").write_text(json.dumps(result, indent=1) + "\n")
        write_page(result, out / "seam.html")
    where = out or RESULTS
    print(f"wrote {where / 'seam.json'} and {where / 'seam.html'} in {seconds:.0f}s")
    return result


if __name__ == "__main__":
    main()
