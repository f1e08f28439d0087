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

The long run (`--long`) trains each arm the demo's whole schedule over several seeds and
evaluates the policy every 2 steps on the same held-out prompts, so that each defect's cost is
measured in eval reward with a 95% interval over seeds (seam_stats): the committed
bench/results/seam.json and seam.html are that run. Its arms run two at a time in subprocesses
(`--jobs`, one torch thread each).

    rowgrove bench seam --long [--seeds N] [--jobs J]     # the committed run, about an hour on 2 cores
    rowgrove bench seam [--seeds N] [--out DIR]           # 4 steps a run: the row figures, short curves
    rowgrove bench seam --quick                           # a smoke run

A long run writes bench/results/seam.json and seam.html (and to --out when given); the short and
quick runs write only to --out (default runs/bench-seam), so they never replace the long run's.
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
import seam_stats as stats  # noqa: E402
from seam_report import write_page  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# Sizes: the demo's task, agent and optimizer (rowgrove.train.presets.DEMO), fewer prompts and
# steps per run (4 prompts x 4 rollouts, 4 steps) so that 7 seams x 2 seeds fit in about 15 to 30
# minutes on 2 shared cores.
# The warm-up is the demo's own (cached with `rowgrove demo`'s: the first run of either pays it).
FULL = {"steps": 4, "prompts_per_step": 4, "rollouts_per_prompt": 4, "rollouts_per_minibatch": 8,
        "eval_prompts": 0}
QUICK = {"steps": 2, "prompts_per_step": 2, "rollouts_per_prompt": 4, "rollouts_per_minibatch": 4,
         "eval_prompts": 0}
# The long run: the demo's own schedule and sizes (14 steps of 8 prompts x 8 rollouts; the demo
# lifts eval reward 0.45 -> 0.63 on it), evaluated every 2 steps on the demo's 64 held-out prompts
# (the same prompts and sampling seeds at every evaluation and in every arm of a seed). 6 seeds:
# in the pilot (2 seeds of rowgrove's arm) the eval reward at steps 8-12 moved by 0.00-0.04
# between seeds and one evaluation's own noise is about 0.03 (64 prompts), so 6 seeds put the
# 95% interval of a mean near +-0.03 and of a paired gap (same seeds, same eval prompts) below
# that; 7 arms x 6 seeds at about 75 s a run, two at a time, is about an hour on 2 cores.
LONG = {"steps": 14, "prompts_per_step": 8, "rollouts_per_prompt": 8, "rollouts_per_minibatch": 16,
        "eval_prompts": 64, "eval_every": 2, "threads": 1}
LONG_SEEDS = 6
# "Steps to reach" threshold: in the pilot rowgrove's arm reached 0.60 at step 6 and step 10 of 14
# (from 0.45 after the warm-up), so it separates a fast learner from a slow one within the run.
THRESHOLD = 0.60


def base_config(quick: bool, long: bool = False, **overrides: Any) -> Any:
    """The trainer config every run of the benchmark shares (seed and out are set per run)."""
    from rowgrove.train.config import TrainConfig
    from rowgrove.train.presets import DEMO

    sizes = LONG if long else QUICK if quick else FULL
    return TrainConfig(**{**DEMO, "checkpoint_every": 0, "progress": False, "threads": 0, "concurrency": 32,
                          **sizes, **overrides})


def plan(cfg: Any, seeds: int, names: Sequence[str] = sd.SEAMS) -> list[tuple[str, int, Any]]:
    """Every run of the benchmark as (seam, seed, config), seed by seed: within a seed the arms
    share one config, so they differ only in the seam passed to train()."""
    return [(name, seed, cfg.replace(seed=seed)) for seed in range(seeds) for name in names]


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
    """One training run with seam `name`; its metrics, one record per step (with `eval_reward`
    at the steps it evaluated; step 0's and the last step's evaluation as `eval_before` on the
    first record and `eval_after` on the last)."""
    from rowgrove.train.loop import train
    from rowgrove.train.report import read_metrics

    out = root / f"{name}-s{seed}"
    summary = train(cfg.replace(seed=seed, out=str(out)), log=lambda *a: None, seam=make_seam(name, figures))
    recs = read_metrics(out)
    if recs and summary is not None:
        recs[0]["eval_before"], recs[-1]["eval_after"] = summary.eval_before, summary.eval_after
    return recs


def evals_of(recs: Sequence[dict[str, Any]]) -> dict[int, float]:
    """{step: eval reward} of one run (0: the warmed model; the last step: after GRPO)."""
    out: dict[int, float] = {}
    if recs and recs[0].get("eval_before") is not None:
        out[0] = float(recs[0]["eval_before"])
    for r in recs:
        if r.get("eval_reward") is not None:
            out[int(r["step"])] = float(r["eval_reward"])
    if recs and recs[-1].get("eval_after") is not None:
        out[int(recs[-1]["step"])] = float(recs[-1]["eval_after"])
    return out


def _run_in_subprocess(cfg: Any, name: str, seed: int, root: Path, want_figures: bool) -> tuple[list[Any], list[Any]]:
    """run_seam in a fresh interpreter (the long run's arms run side by side, one torch thread
    each); (metrics records, figures)."""
    import subprocess

    spec = root / f"{name}-s{seed}.job.json"
    result = root / f"{name}-s{seed}.result.json"
    spec.write_text(json.dumps({"config": cfg.to_dict(), "name": name, "seed": seed, "root": str(root),
                                "figures": want_figures, "result": str(result)}))
    proc = subprocess.run([sys.executable, __file__, "--run-one", str(spec)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"seam run {name} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    data = json.loads(result.read_text())
    return data["records"], data["figures"]


def _run_one(spec_path: Path) -> None:
    """The subprocess side of _run_in_subprocess."""
    from rowgrove.train.config import TrainConfig

    spec = json.loads(Path(spec_path).read_text())
    cfg = TrainConfig(**spec["config"])
    figures: list[dict[str, Any]] | None = [] if spec["figures"] else None
    recs = run_seam(cfg, spec["name"], spec["seed"], Path(spec["root"]), figures)
    Path(spec["result"]).write_text(json.dumps({"records": recs, "figures": figures or []}, default=float))


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


def summarize_evals(evals: dict[str, dict[str, dict[int, float]]], threshold: float = THRESHOLD) -> dict[str, Any]:
    """The long run's reward figures per arm, from {seam: {seed: {step: eval reward}}}: at every
    evaluated step the mean and 95% interval over seeds, and the paired gap to rowgrove's (same
    seeds); the final step's (the headline); the mean of the last 3 evaluations (steadier than
    one); and the steps each seed took to reach `threshold` (None: not within the run)."""
    out: dict[str, Any] = {"threshold": threshold}
    ref = evals.get("rowgrove", {})
    for name, per_seed in evals.items():
        steps = sorted({st for e in per_seed.values() for st in e})
        if not steps:
            continue
        last = steps[-1]
        late = steps[-3:]
        late_of, ref_late = _mean_over(per_seed, late), _mean_over(ref, late)
        reach = {seed: stats.steps_to(threshold, e) for seed, e in per_seed.items()}
        reached = [v for v in reach.values() if v is not None]
        out[name] = {
            "steps": steps,
            "by_step": {str(st): stats.mean_ci([e[st] for e in per_seed.values() if st in e]) for st in steps},
            "gap_by_step": {str(st): stats.paired_gap({k: e[st] for k, e in per_seed.items() if st in e},
                                                      {k: e[st] for k, e in ref.items() if st in e})
                            for st in steps},
            "final_step": last,
            "final": stats.mean_ci([e[last] for e in per_seed.values() if last in e]),
            "final_gap": stats.paired_gap({k: e[last] for k, e in per_seed.items() if last in e},
                                          {k: e[last] for k, e in ref.items() if last in e}),
            "late_steps": late,
            "late": stats.mean_ci(list(late_of.values())),
            "late_gap": stats.paired_gap(late_of, ref_late),
            "steps_to_threshold": reach,
            "steps_to_threshold_mean": float(np.mean(reached)) if reached else None,
            "reached_threshold": f"{len(reached)}/{len(reach)}",
        }
    return out


def _mean_over(per_seed: dict[str, dict[int, float]], steps: Sequence[int]) -> dict[str, float]:
    """{seed: mean eval reward over `steps`} of the seeds evaluated at all of them."""
    return {seed: float(np.mean([e[st] for st in steps])) for seed, e in per_seed.items()
            if all(st in e for st in steps)}


def _mean(xs: Sequence[float | None]) -> float | None:
    """Mean of the values that are numbers (a step without any trained rollout has no ratio)."""
    vals = [float(x) for x in xs if x is not None and np.isfinite(x)]
    return float(np.mean(vals)) if vals else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, short curves (a smoke check, not a measurement)")
    p.add_argument("--long", action="store_true",
                   help=f"the committed run: the demo's {LONG['steps']} steps, eval every {LONG['eval_every']} "
                        f"steps, {LONG_SEEDS} seeds (about an hour on 2 cores); writes bench/results/seam.*")
    p.add_argument("--seeds", type=int, default=None,
                   help=f"seeds per seam (default 2; {LONG_SEEDS} with --long; 1 with --quick)")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs side by side, each in its own process with one torch thread (default 2 with --long, "
                        "else 1: in this process)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write seam.json and seam.html here (a --long run always writes them to "
                        "bench/results; the others only here, default runs/bench-seam)")
    p.add_argument("--figures-only", action="store_true", help="only the rowgrove runs and their figures, no curves")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 4; 2 with --quick; 14 with --long)")
    p.add_argument("--run-one", type=Path, default=None, help=argparse.SUPPRESS)  # a --jobs worker
    args = p.parse_args(argv)
    if args.run_one is not None:
        _run_one(args.run_one)
        return {}
    if args.quick and args.long:
        p.error("--quick and --long exclude each other")
    seeds = args.seeds if args.seeds is not None else (LONG_SEEDS if args.long else 1 if args.quick else 2)
    jobs = args.jobs if args.jobs is not None else (2 if args.long else 1)
    if seeds < 1 or jobs < 1 or (args.steps is not None and args.steps < 1):
        p.error("--seeds, --jobs and --steps must be at least 1")
    if args.out is None and not args.long:
        args.out = Path("runs/bench-seam")  # only the long run's page goes into bench/results
    t0 = time.time()
    from rowgrove.train.loop import prepare_model_dir

    cfg = base_config(args.quick, args.long, **({"steps": args.steps} if args.steps else {}))
    # one warm-up for every run: later runs start from its folder and skip their own
    start = prepare_model_dir(cfg.replace(seed=0), log=print)
    cfg = cfg.replace(model=str(start), warmup_sft_steps=0)
    names = sd.SEAMS[:1] if args.figures_only else sd.SEAMS
    figures: dict[str, list[dict[str, Any]]] = {}
    curves: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    evals: dict[str, dict[str, dict[int, float]]] = {name: {} for name in names}
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-seam-") as tmp:

        def one(job: tuple[str, int, Any]) -> None:
            name, seed, run_cfg = job
            t = time.time()
            want = name == "rowgrove"
            if jobs == 1:
                figs: list[dict[str, Any]] | None = [] if want else None
                recs = run_seam(run_cfg, name, seed, Path(tmp), figs)
            else:
                recs, figs = _run_in_subprocess(run_cfg, name, seed, Path(tmp), want)
            if want:
                figures[str(seed)] = list(figs or [])
            curves[name][str(seed)] = [r["reward_mean"] for r in recs]
            evals[name][str(seed)] = evals_of(recs)
            ev = "  eval " + " ".join(f"{k}:{v:.3f}" for k, v in evals[name][str(seed)].items()) if evals[name][str(seed)] else ""
            print(f"seed {seed} {name:17s} reward per step {' '.join(f'{x:.3f}' for x in curves[name][str(seed)])}"
                  f"{ev}  ({time.time() - t:.0f}s)", flush=True)

        runs = plan(cfg, seeds, names)
        if jobs == 1:
            for job in runs:
                one(job)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                for f in [pool.submit(one, job) for job in runs]:
                    f.result()
    seconds = time.time() - t0
    curves = {name: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for name, c in curves.items()}
    evals = {name: dict(sorted(e.items(), key=lambda kv: int(kv[0]))) for name, e in evals.items()}
    figures = dict(sorted(figures.items(), key=lambda kv: int(kv[0])))
    result = {
        "benchmark": "seam: what each known seam defect costs, on the same rollouts as rowgrove's seam",
        "command": "rowgrove bench seam " + " ".join(shlex.quote(a) for a in (argv or [])),
        "quick": args.quick, "long": args.long, "seeds": seeds, "jobs": jobs, "seconds": seconds,
        "config": {k: v for k, v in cfg.to_dict().items() if k not in ("out", "model")},
        "model": "tiny-task after the demo's warm-up (seed 0), shared by every run",
        "defects": sd.DEFECTS,
        "figures": figures, "curves": curves, "summary": summarize(figures, curves),
    }
    if any(evals[name] and any(evals[name].values()) for name in evals):
        result["evals"] = {name: {seed: {str(k): v for k, v in e.items()} for seed, e in per.items()}
                           for name, per in evals.items()}
        result["reward"] = summarize_evals(evals)
    if args.long:
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
