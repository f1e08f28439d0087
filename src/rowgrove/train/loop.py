"""The reference GRPO loop, short enough to read in one sitting.

Which GRPO this is: on-policy rollouts (one engine sampling with the current weights), group-
relative advantages per prompt (`estimator`: grpo (r - mean) / std, dr_grpo r - mean, or rloo),
the PPO-clip surrogate against the engine's own logprobs (ratio = exp(logp_policy - logp_engine)
on every sampled token), optionally GRPO's KL penalty to the starting policy (`kl_coef`, k3
estimator, same token weights), several optimizer updates per step when the rollouts fill
several mini-batches.

    for step:
        prompts ──► n rollouts each, run concurrently by the reference agent (compaction,
                    resampling) through the gateway, which serves the HF engine in this process
        ledger  ──► rows (rowgrove.assemble.rollout_rows: one row per chain of accepted calls)
        rows    ──► assign_advantages (one advantage per rollout, baseline per group_id)
                ──► minibatches of whole rollouts ──► per mini-batch: loss_weights, packed
                    micro-batches, backward on each, ONE optimizer step
        policy  ──► engine.update_weights(state_dict)

Every divisor of the loss (nothing else divides it):
- token-mean (default): each trained token of a mini-batch weighs 1 / T, T = the tokens with loss
  mask 1 of the mini-batch's valid rollouts (all rows, all micro-batches).
- rollout-mean: each valid rollout weighs 1 / R (R = valid rollouts of the mini-batch with a
  trained token) and shares it over its own T_r tokens: 1 / (R * T_r).
- Micro-batches and gradient accumulation divide by nothing: the step loss is the plain sum of
  weight * per-token loss, so the number of micro-batches and of rows per rollout is invisible.
- The advantage's own divisor is the group's reward std when `scale_by_std` (grpo only).
Invalid rollouts (a broken episode, rows that do not match the record) weigh 0 and are counted.

Generation and training alternate in one process and one torch thread pool (FACTS.md: two pools
on 2 cores slow both ~50x): rollouts run while the trainer waits; the update runs while the
engine is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rowgrove.errors import InputError
from rowgrove.train.config import TrainConfig, config_hash
from rowgrove.train.jobs import agent_config as _agent_config
from rowgrove.train.jobs import mix as _mix
from rowgrove.types import Row


@dataclass
class RunSummary:
    """What a finished (or resumed-and-finished) run reports."""

    run_dir: Path
    steps: int
    reward_first: float
    reward_last: float
    eval_before: float | None
    eval_after: float | None
    rows_per_rollout: float
    tokens_generated: int
    tokens_trained: int
    seconds: float
    report: Path
    extra: dict[str, Any] = field(default_factory=dict)
    reward_last_3: float | None = None  # mean of the last 3 steps' rewards (fewer when the run is shorter)

    def table(self) -> dict[str, Any]:
        """The summary as an ordered dict for printing and the report."""
        d = {
            "steps": self.steps,
            "reward, first step (mean of rollouts)": self.reward_first,
            "reward, last step": self.reward_last,
            "reward, mean of the last 3 steps": self.reward_last_3,
            "eval reward after warm-up (step 0)": self.eval_before,
            "eval reward after GRPO": self.eval_after,
            "rows per rollout": self.rows_per_rollout,
            "tokens generated": self.tokens_generated,
            "tokens trained": self.tokens_trained,
            "seconds": self.seconds,
        }
        d.update(self.extra)
        return {k: v for k, v in d.items() if v is not None}


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_factor(cfg: TrainConfig) -> Any:
    """The LR multiplier of optimizer update u: linear warm-up over `lr_warmup_steps` updates,
    then linear decay to `lr_decay_to` at the run's last update (steps x updates per step)."""
    total = cfg.steps * math.ceil(cfg.prompts_per_step * cfg.rollouts_per_prompt / cfg.rollouts_per_minibatch)
    warm, end = cfg.lr_warmup_steps, cfg.lr_decay_to

    def factor(u: int) -> float:
        if warm and u < warm:
            return (u + 1) / warm
        span = max(1, total - 1 - warm)
        return 1.0 - (1.0 - end) * min(1.0, max(0, u - warm) / span)

    return factor


# ---- the model: tiny (with the task's corpus) or a HF dir, warmed up and cached --------------

def prepare_model_dir(cfg: TrainConfig, log: Any = print) -> Path:
    """The directory of the model GRPO starts from: the base model, after the supervised
    warm-up when `warmup_sft_steps` > 0. Both are cached (the warm-up by a hash of everything
    that determines it), so a second run starts in seconds."""
    from rowgrove.model.load import load_model, model_dir
    from rowgrove.train.warmup import save_model_dir, warm_model_dir, warm_up

    if cfg.model == "tiny-task":
        from rowgrove.envs import task_corpus
        from rowgrove.model.tiny import tiny_model_dir

        base = tiny_model_dir(seed=cfg.seed, layers=cfg.tiny_layers, hidden=cfg.tiny_hidden,
                              extra_corpus=tuple(task_corpus(cfg.env)))
    else:
        base = model_dir(cfg.model)
    if cfg.warmup_sft_steps == 0:
        return base
    from rowgrove.envs import make_tasks

    tasks = [t.prompt for t in make_tasks(cfg.env, 8, cfg.seed)]  # the task distribution is part of the key
    key = config_hash({"base": str(base.resolve()), "env": cfg.env, "tasks": tasks, "steps": cfg.warmup_sft_steps,
                       "lr": cfg.warmup_sft_lr, "batch": cfg.warmup_sft_batch, "policy": cfg.warmup_policy,
                       "seed": cfg.seed, "dtype": cfg.dtype, "agent": _agent_config(cfg).__dict__, "v": 2})
    out = warm_model_dir(key)
    if (out / "rowgrove-warm.done").exists():
        return out
    t0 = time.time()
    model, tok = load_model(str(base), device=cfg.device, dtype=cfg.dtype)
    losses = warm_up(model, tok, cfg.env, steps=cfg.warmup_sft_steps, batch=cfg.warmup_sft_batch,
                     lr=cfg.warmup_sft_lr, seed=cfg.seed, policy=cfg.warmup_policy,
                     agent_config=_agent_config(cfg))
    save_model_dir(model, tok, out)
    log(f"warm-up: {cfg.warmup_sft_steps} SFT steps on {cfg.env} transcripts ({cfg.warmup_policy} policy), "
        f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {time.time() - t0:.1f}s")
    return out


# ---- the engine: in this process (hf) or a running vLLM / SGLang server ------------------------

def _served_dir(cfg: TrainConfig) -> Path:
    """The folder a server started with `--model cfg.model` serves."""
    from rowgrove.model.load import model_dir

    if cfg.model == "tiny-task":
        return prepare_model_dir(cfg.replace(warmup_sft_steps=0), log=lambda *_: None)
    return model_dir(cfg.model)


def make_rollout_engine(cfg: TrainConfig, start_dir: Path, model: Any, tokenizer: Any, run_dir: Path) -> Any:
    """The engine rollouts sample from. hf: a copy of the policy in this process (weights copied
    in after each step). vllm / sglang: the servers at `engine_url`, checked to serve the model
    folder's tokenizer; weights reach them as checkpoints under RUN_DIR/weights."""
    if cfg.engine == "hf":
        from rowgrove.engines.hf import HFEngine

        engine_model = copy.deepcopy(model).eval()
        engine_model.set_attn_implementation("sdpa")
        return HFEngine(engine_model, tokenizer, max_batch=max(1, min(cfg.concurrency, 64)))
    from rowgrove.engines import make_engine

    # the servers were started on the base folder (`--model`), whatever warm-up made of it
    return make_engine(cfg.engine, str(start_dir), url=cfg.engine_url, sync_dir=run_dir / "weights",
                       sync_tolerance=cfg.sync_tolerance,
                       served_model=str(_served_dir(cfg)) if cfg.engine == "sglang" else None)


# ---- rollouts ---------------------------------------------------------------------------------

def run_group_rollouts(gateway_url: str, cfg: TrainConfig, tasks: list[Any], n: int, tag: str,
                       seed: int) -> list[Any]:
    """Run `n` rollouts of each task through the gateway (group id `{tag}-p{i}` per task), each
    model call seeded from (seed, task, rollout, action, attempt); EpisodeResults in job order."""
    from rowgrove.agents import RolloutJob, run_rollouts_concurrently
    from rowgrove.envs import make_env

    agent = _agent_config(cfg)
    jobs = []
    for i, task in enumerate(tasks):
        for k in range(n):
            base = _mix(seed, i, k)
            jobs.append(RolloutJob(
                group_id=f"{tag}-p{i}", env=make_env(cfg.env, seed), task=task, config=agent,
                metadata={"tag": tag, "task_id": task.task_id},
                extra_body=(lambda a, att, base=base: {"seed": _mix(base, a, att)})))
    return asyncio.run(run_rollouts_concurrently(gateway_url, jobs, cfg.concurrency))


def collect_rows(ledger: Any, results: list[Any]) -> tuple[list[Row], list[Any]]:
    """Rows of every rollout (rollout_rows from the ledger) and their RolloutRows, in order.
    Row rollout ids become `{position:06d}:{rollout id}`."""
    import dataclasses

    from rowgrove.assemble import rollout_rows

    rows: list[Row] = []
    built = []
    for j, res in enumerate(results):
        rr = rollout_rows(ledger, res.info["rollout_id"])
        built.append(rr)
        # rollout ids are random; prefix the job's position so that mini-batch assignment (which
        # sorts ids before shuffling with the step's seed) is reproducible run to run
        rows.extend(dataclasses.replace(r, rollout_id=f"{j:06d}:{r.rollout_id}") for r in rr.rows)
    return rows, built


class _LocalRollouts:
    """The gateway in this process in front of `engine`, its ledger read back for rows. The loop
    talks to this or to `rowgrove.train.ray_rollouts.RayRollouts` (gateways on Ray) alike."""

    def __init__(self, gw: Any, engine: Any, ledger: Any):
        self.gw, self.engine, self.ledger = gw, engine, ledger

    @property
    def weights_version(self) -> int:
        return int(self.engine.weights_version)

    def run(self, cfg: TrainConfig, tasks: list[Any], n: int, tag: str, seed: int) -> list[Any]:
        return run_group_rollouts(self.gw.url, cfg, tasks, n, tag, seed)

    def rows(self, results: list[Any]) -> tuple[list[Row], list[Any]]:
        return collect_rows(self.ledger, results)

    def sync(self, state_dict: dict[str, Any], model: Any = None) -> int:
        """The policy's weights to the engine. A remote engine (vLLM, SGLang) checks its servers'
        probe logprobs against `model`'s own, the trainer's policy on its own device (no CPU copy
        of the weights is held); the in-process hf engine shares the tensors, nothing to check."""
        from rowgrove.engines.remote import RemoteEngine

        if model is not None and isinstance(self.engine, RemoteEngine):
            from rowgrove.train.update import probe_logprobs

            self.engine.update_weights(state_dict, reference=lambda ids: probe_logprobs(model, ids))
        else:
            self.engine.update_weights(state_dict)
        return self.weights_version

    def lineages(self, built: list[Any], tokenizer: Any = None) -> list[tuple[str, str]]:
        return _lineages(self.ledger, built, tokenizer)


@contextlib.contextmanager
def _local_rollouts(start_dir: Path, engine: Any, ledger_path: Path) -> Any:
    from rowgrove.gateway.testing import start_gateway
    from rowgrove.ledger import Ledger

    with start_gateway(str(start_dir), engine=engine, ledger=ledger_path) as gw:
        ledger = Ledger(ledger_path, readonly=True)
        try:
            yield _LocalRollouts(gw, engine, ledger)
        finally:
            ledger.close()


# ---- the loop ---------------------------------------------------------------------------------

def train(cfg: TrainConfig, *, resume: bool = False, log: Any = print,
          seam: Callable[..., tuple[list[Row], Any, dict[str, Any]]] | None = None) -> RunSummary | None:
    """Run (or, with `resume`, continue) the GRPO run `cfg` describes in `cfg.out`; see the module
    docstring. Writes metrics.jsonl, checkpoints/, ledger.sqlite, plots/ and report.html there.

    `seam` swaps rowgrove's own step from rows to loss (assign_advantages, then loss_weights) for
    another, so that a benchmark can train with a known defect switched on (bench/bench_seam.py):
    a callable `seam(step=, rows=, built=, ledger=, model=, tokenizer=, cfg=)` returning (rows
    with advantages, the weight function update_policy is to use, extra metrics for the step).

    Inside a torch.distributed process group (`rowgrove train --nproc N`, torchrun) every rank
    calls this: rank 0 runs the gateway, the rollouts, the checkpoints, metrics and report, and
    returns the summary; the other ranks join each step's update (rowgrove.train.parallel) and
    return None. Checkpoints hold the plain model, so any rank count resumes any other's."""
    from rowgrove.algo import assign_advantages
    from rowgrove.envs import make_tasks
    from rowgrove.model.load import load_model
    from rowgrove.train.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
    from rowgrove.train.parallel import DataParallel, broadcast, init_from_env, local_device
    from rowgrove.train.report import append_metrics, read_metrics, truncate_metrics

    t_start = time.time()
    run_dir = Path(cfg.out)
    _agent_config(cfg)  # the agent options and the env are checked before anything is written
    make_tasks(cfg.env, 0)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # data-parallel (`--nproc`, torchrun): rank 0 runs everything below; the other ranks load the
    # same model and state, then join each step's update (the short loop after DataParallel)
    distributed = init_from_env(cfg.device)
    main = not distributed or torch.distributed.get_rank() == 0
    saved = cfg  # config.json keeps "cuda", not this rank's "cuda:K": a resume may use other ranks
    if distributed:
        cfg = cfg.replace(device=local_device(cfg.device))
    ckpt = load_checkpoint(run_dir) if resume and main else None
    if not resume and main:
        if (run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists():
            raise InputError(f"{run_dir} already holds a run: resume it with --resume {run_dir}, "
                             "or pass a new --out directory")
    seed_everything(cfg.seed)

    start_dir = prepare_model_dir(cfg, log) if main else None
    if distributed:  # the warm-up is cached: the other ranks find rank 0's
        torch.distributed.barrier()
        start_dir = start_dir or prepare_model_dir(cfg, lambda *_: None)
        ckpt = broadcast(ckpt)
    assert start_dir is not None
    model, tok = load_model(str(start_dir), device=cfg.device, dtype=cfg.dtype)
    if main:  # written once the model loads: a config that fails before it leaves no run directory behind
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(saved.to_dict(), indent=2, sort_keys=True) + "\n")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg))
    start_step, extra = 0, {}
    if ckpt is not None:
        model.load_state_dict(ckpt.model)
        optimizer.load_state_dict(ckpt.optimizer)
        if ckpt.scheduler is not None:
            scheduler.load_state_dict(ckpt.scheduler)
        set_rng_state(ckpt.rng)
        start_step, extra = ckpt.step, dict(ckpt.extra)
        if main:
            truncate_metrics(run_dir, start_step)
            log(f"resuming {run_dir} after step {start_step}")

    ref_model = None
    if cfg.kl_coef > 0:  # the starting policy, frozen (also on resume: it is the warmed model)
        ref_model, _ = load_model(str(start_dir), device=cfg.device, dtype=cfg.dtype)
        ref_model.eval().requires_grad_(False)
    dp = DataParallel(model) if distributed else None
    if dp is not None and not dp.is_main:
        for step in range(start_step + 1, cfg.steps + 1):
            _update(cfg, step, model, optimizer, scheduler, None, ref_model, dp)
        return None
    if cfg.ray:  # gateways as Ray actors, each with its own engine (rowgrove.train.ray_rollouts)
        from rowgrove.train.ray_rollouts import RayRollouts

        rollouts: Any = RayRollouts(cfg, start_dir, run_dir)
        if ckpt is not None:
            rollouts.sync(model.state_dict(), model)
    engine = None if cfg.ray else make_rollout_engine(cfg, start_dir, model, tok, run_dir)
    if engine is not None and cfg.engine != "hf":
        engine.weights_version = int(extra.get("weights_version", 0))
        if ckpt is not None or start_dir.resolve() != _served_dir(cfg).resolve():
            # the servers serve the base folder; the policy starts from the warm-up or a checkpoint
            _LocalRollouts(None, engine, None).sync(model.state_dict(), model)
            log(f"weights synced to {cfg.engine} at {cfg.engine_url} (version {engine.weights_version})")
    eval_tasks = make_tasks(cfg.env, cfg.eval_prompts, _mix(cfg.seed, 999_983) % 2**31)

    def evaluate(tag: str) -> float | None:
        if not eval_tasks:
            return None
        results = rollouts.run(cfg, eval_tasks, 1, tag, _mix(cfg.seed, 77))
        return float(np.nanmean([r.reward for r in results]))

    bar = None
    with (contextlib.closing(rollouts) if cfg.ray
          else _local_rollouts(start_dir, engine, run_dir / "ledger.sqlite")) as rollouts:
        if start_step == 0 and "eval_before" not in extra:
            extra["eval_before"] = evaluate("eval-before")
            if extra["eval_before"] is not None:
                log(f"eval reward after warm-up (step 0): {extra['eval_before']:.3f} on {len(eval_tasks)} prompts")
        if cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=start_step, desc="grpo", unit="step", dynamic_ncols=True)
        last_built: list[Any] = []
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rowgrove-rollouts")

        def launch(step: int) -> Future | None:
            """Start step `step`'s rollouts in the background (None past the last step)."""
            if step > cfg.steps:
                return None
            tasks = make_tasks(cfg.env, cfg.prompts_per_step, _mix(cfg.seed, step) % 2**31)
            return pool.submit(rollouts.run, cfg, tasks, cfg.rollouts_per_prompt, f"s{step}",
                               _mix(cfg.seed, step, 1))

        pending = launch(start_step + 1)
        for step in range(start_step + 1, cfg.steps + 1):
            t0 = time.time()
            results = pending.result()
            # off-policy: the next step's rollouts are sampled while this step trains, and the
            # weight sync below lands while they run (their tokens carry the versions they got)
            pending = launch(step + 1) if cfg.off_policy_steps else None
            rows, built = rollouts.rows(results)
            stale_rec = {}
            if cfg.max_staleness is not None:
                # the version the engine holds now, before this step's update
                rows, stale_rec = _mask_stale(rows, rollouts.weights_version, cfg.max_staleness)
            t1 = time.time()
            if seam is None:
                rows = assign_advantages(rows, estimator=cfg.estimator, scale_by_std=cfg.scale_by_std)
                weight_fn, seam_rec = None, {}
            else:
                rows, weight_fn, seam_rec = seam(step=step, rows=rows, built=built, ledger=rollouts.ledger,
                                                 model=model, tokenizer=tok, cfg=cfg)
            vision = row_vision_inputs(tok, rollouts.ledger) if rollouts.ledger is not None else None
            stats = _update(cfg, step, model, optimizer, scheduler, rows, ref_model, dp,
                            weight_fn=weight_fn, vision_inputs=vision)
            model.eval()
            extra["weights_version"] = rollouts.sync(model.state_dict(), model)
            eval_rec = {}
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                # before the next step's rollouts start, so the evaluation has the engine alone
                eval_rec = {"eval_reward": evaluate(f"eval-s{step}")}
            if pending is None:
                pending = launch(step + 1)
            t2 = time.time()
            rewards = np.asarray([r.reward for r in results], np.float64)  # NaN: masked on Ray (a lost gateway)
            rec = {
                "step": step, "reward_mean": float(np.nanmean(rewards)), "reward_std": float(np.nanstd(rewards)),
                "rows_per_rollout": len(rows) / len(results),
                "roots_per_rollout": float(np.mean([b.metrics.get("roots", 0) for b in built])),
                "rejected_calls": int(sum(b.metrics.get("rejected_calls", 0) for b in built)),
                "invalid_rollouts": int(sum(not b.valid for b in built)),
                "compactions": float(np.mean([r.compactions for r in results])),
                "tokens_generated": int(sum(b.metrics.get("generated_tokens", 0) for b in built)),
                "tokens_trained": int(stats["tokens_trained"]),
                "clip_fraction": stats["clip_fraction"], "approx_kl": stats["approx_kl"],
                "entropy": stats["entropy"], "ref_kl": stats["ref_kl"], "updates": int(stats["updates"]),
                "lr": float(scheduler.get_last_lr()[0]), "rollout_time": t1 - t0, "train_time": t2 - t1,
                "step_time": t2 - t0, "weights_version": int(rollouts.weights_version), **eval_rec, **stale_rec, **seam_rec,
            }
            append_metrics(run_dir, rec)
            last_built = [(r, b) for r, b in zip(results, built, strict=True)]
            if step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                save_checkpoint(run_dir, step=step, data_position=step, model=model, optimizer=optimizer,
                                scheduler=scheduler, extra=extra)
            if bar is not None:
                bar.set_postfix(reward=f"{rec['reward_mean']:.3f}", rows=f"{rec['rows_per_rollout']:.2f}")
                bar.update(1)
        pool.shutdown(wait=True)
        if bar is not None:
            bar.close()
        extra["eval_after"] = evaluate("eval-after")
        lineages = rollouts.lineages(last_built, tok)
    return _finish(run_dir, cfg, extra, lineages, time.time() - t_start, read_metrics(run_dir))


def _update(cfg: TrainConfig, step: int, model: Any, optimizer: Any, scheduler: Any, rows: list[Row] | None,
            ref_model: Any, dp: Any, *, weight_fn: Any = None, vision_inputs: Any = None) -> dict[str, float]:
    """Step `step`'s policy update (every rank calls it together under data parallelism; only
    rank 0 has the rows)."""
    from rowgrove.train.update import update_policy

    return update_policy(model, optimizer, rows, loss_mode=cfg.loss_mode,
                         rollouts_per_minibatch=cfg.rollouts_per_minibatch,
                         microbatch_tokens=cfg.microbatch_tokens, clip_eps=cfg.clip_eps,
                         seed=_mix(cfg.seed, step, 2) % 2**31, packed=cfg.packed,
                         max_grad_norm=cfg.max_grad_norm, scheduler=scheduler,
                         ref_model=ref_model, kl_coef=cfg.kl_coef, dp=dp,
                         weight_fn=weight_fn, vision_inputs=vision_inputs)


def row_vision_inputs(tokenizer: Any, ledger: Any) -> Any:
    """For a vision model, `row -> pixel inputs of its images` (read from the ledger's media
    table, processed by the model's own image processor); None for a text model."""
    from rowgrove.model.vision import vision_of

    vision = vision_of(tokenizer)
    if vision is None:
        return None
    from rowgrove.errors import RowgroveError
    from rowgrove.gateway.images import stored_image

    def inputs(row: Row) -> dict[str, Any]:
        images = [stored_image(ledger, d) for d in row.images]
        missing = [d for d, im in zip(row.images, images, strict=True) if im is None]
        if missing:
            raise RowgroveError(f"row of rollout {row.rollout_id} names images the ledger does not hold "
                                f"({', '.join(missing[:2])}): train from the ledger that captured it")
        return vision.pixel_inputs(images)

    return inputs


def _mask_stale(rows: list[Row], current: int, max_staleness: int) -> tuple[list[Row], dict[str, Any]]:
    """`mask_stale` on the step's rows, and its metrics: stale_rollouts (rollouts masked as more
    than `max_staleness` versions behind `current`), staleness_max (the largest staleness of a
    rollout whose versions are known; None when none is)."""
    from rowgrove.algo import mask_stale, staleness

    ages = staleness(rows, current)
    rec = {"stale_rollouts": sum(a > max_staleness for a in ages.values()),
           "staleness_max": max(ages.values(), default=None)}
    return mask_stale(rows, current, max_staleness), rec


def _lineages(ledger: Any, built: list[Any], tokenizer: Any = None, k: int = 4) -> list[tuple[str, str]]:
    """Lineage SVGs of up to k rollouts of the last step, chosen across rewards and row counts
    (report.choose_examples), each followed by its rows as decoded text with the trained spans
    marked (when a tokenizer is given)."""
    from rowgrove.assemble import read_calls
    from rowgrove.assemble.picture import render_svg
    from rowgrove.assemble.rowtext import rows_html
    from rowgrove.train.report import choose_examples

    pics = []
    picks = choose_examples([res.reward for res, _ in built], [len(rr.rows) for _, rr in built], k)
    for res, rr in (built[i] for i in picks):
        calls = read_calls(ledger, rr.rollout_id)
        title = (f"rollout {rr.rollout_id}: reward {res.reward:.2f}, {len(rr.rows)} rows, "
                 f"{res.compactions} compactions, {res.rejected} rejected")
        text = rows_html(rr.rows, tokenizer) if tokenizer is not None else ""
        pics.append((title, render_svg(calls, rr, rr.rows, images=ledger.call_images(rr.rollout_id)) + text))
    return pics


def _finish(run_dir: Path, cfg: TrainConfig, extra: dict[str, Any], lineages: list[tuple[str, str]],
            seconds: float, records: list[dict[str, Any]]) -> RunSummary:
    from rowgrove.train.report import write_report

    def avg(key: str, recs: list[dict[str, Any]]) -> float:
        return float(np.mean([r[key] for r in recs])) if recs else math.nan

    summary = RunSummary(
        run_dir=run_dir, steps=len(records),
        reward_first=avg("reward_mean", records[:1]), reward_last=avg("reward_mean", records[-1:]),
        eval_before=extra.get("eval_before"), eval_after=extra.get("eval_after"),
        rows_per_rollout=avg("rows_per_rollout", records),
        tokens_generated=int(sum(r["tokens_generated"] for r in records)),
        tokens_trained=int(sum(r["tokens_trained"] for r in records)),
        seconds=seconds, report=run_dir / "report.html",
        reward_last_3=avg("reward_mean", records[-3:]),
        extra={"model": cfg.model, "env": cfg.env,
               "compaction": dict(cfg.agent).get("compaction", "none"), "loss_mode": cfg.loss_mode},
    )
    write_report(run_dir, records, summary.table(), config=cfg.to_dict(), lineages=lineages,
                 evals=(extra.get("eval_before"), extra.get("eval_after")))
    (run_dir / "summary.json").write_text(json.dumps({k: v for k, v in summary.table().items()},
                                                     indent=2, default=str) + "\n")
    return summary
