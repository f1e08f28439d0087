"""rowgrove rows into TRL's AsyncGRPO (`trl.experimental.async_grpo`, trl 1.16.0), and AsyncGRPO's
weight transfer into the engine the gateway samples from.

    args = AsyncGRPOConfig(..., token_budget=0, weight_sync_steps=1, temperature=1.0)
    worker = RowgroveRolloutWorker(args, rows_fn, prompts, prompts_per_step=4)
    transfer = GatewayWeightTransfer(GATEWAY_URL, "/shared/rowgrove-weights", config=model_config)
    AsyncGRPOTrainer(model_path, args=args, train_dataset=..., rollout_worker=worker,
                     weight_transfer=transfer).train()

AsyncGRPO's protocols, as its trainer uses them (async_grpo_trainer.py):

    rollout worker   .rollout_buffer   a queue of `RolloutSample`s the trainer drains, in order
                     .metrics_queue    dicts of metrics, drained in `log()`
                     .start() after the first weight sync; .stop() at the end;
                     .update_model_version(v) after every sync; .check_health(s) while waiting
    weight transfer  init_weight_transfer(); pause(); send_weights(iter of (name, tensor)); resume();
                     destroy() — every `weight_sync_steps` optimizer steps and once at train begin

`RowgroveRolloutWorker` fills the buffer with rowgrove rows: each row one `RolloutSample`
(`input_ids` = the row's ids, `completion_mask` = its loss mask, `old_log_probs` = the engine's
logprobs), so what AsyncGRPO trains is exactly what the engine sampled, in the context the engine
was given. No re-rendering, no re-tokenization, no fork heuristics: a compacted rollout arrives as
the rows the gateway built.

The weights. AsyncGRPO carries ONE advantage per sample and its loss is

    loss = sum over the micro-batch's trained tokens of  -min(r * adv, clip(r) * adv)
           / n_mb / gradient_accumulation_steps

(n_mb = trained tokens of the micro-batch, one process). The surrogate is positively homogeneous in
the advantage, so a sample whose advantage is `A x w x n_mb x G` adds exactly rowgrove's term
`A x w x surrogate` per token, with `A` from `rowgrove.algo.assign_advantages` and `w` from
`rowgrove.algo.loss_weights` (rowgrove.integrations.weighting; this module owns no math). That needs
(a) `w` constant over a row's trained tokens (true for token-mean and rollout-mean: checked), and
(b) knowing each sample's micro-batch: with `token_budget=0` AsyncGRPO's `FixedCountBatcher` cuts
the queue into consecutive micro-batches of `per_device_train_batch_size` samples, so the worker
lays out one update's rows as whole micro-batches itself and pads the update to
`per_device_train_batch_size x gradient_accumulation_steps` samples (padding samples hold one
trained token with advantage 0: no gradient, and a micro-batch is never empty, which AsyncGRPO's
loss cannot take). One update of the trainer is then one batch of rollouts, however many rows they
became.

Freshness. AsyncGRPO's data path pulls a step's micro-batches plus one more before the step's
optimizer update (HF Trainer gathers the step's batches; accelerate's loader fetches one ahead), so
the rollouts of step k+1 must exist before step k's weight sync: `max_lag` >= 1 (default 1). The
worker samples step k's rollouts with the weights the trainer began step k - max_lag with (at most
max_lag updates behind); every sample carries that version (`model_version`), AsyncGRPO logs the staleness, and the PPO ratio
is taken against the sampler's own logprobs. Refused: `token_budget != 0`, `weight_sync_steps != 1`,
`max_staleness < max_lag`, `temperature != 1` (the trainer would divide its logits by it while the
engine reports raw logprobs).

The weight path. `GatewayWeightTransfer` is rowgrove's one weight path (`GatewaySync`, as the
synchronous TRL trainer uses it): the trainer's tensors are written once per sync to a folder both
can read and posted to the gateway (`POST /v1/weights {"path": ...}`): an in-process engine loads
the tensors, a vLLM/SGLang engine reloads and checks its logprobs against the synced weights
(rowgrove.engines.verify) before answering; given the trainer's logprobs (`reference`), a probe
call checks what the gateway now samples with. A sync that fails, leaves the gateway's version
where it was, or misses the probe's tolerance raises; training never goes on off-policy silently.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rowgrove.errors import InputError, RowgroveError
from rowgrove.integrations.weighting import WeightedRow, check_mode, weigh_rows
from rowgrove.types import Row

try:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample
except ImportError as e:  # the extra is not installed
    raise ImportError("rowgrove.integrations.trl_async needs TRL: pip install 'rowgrove[trl]' (trl==1.16.0)") from e

RowsFn = Callable[[list[Any], "RowgroveRolloutWorker"], Sequence[Row]]


class AsyncGRPOError(RowgroveError):
    """The rollout worker or the weight transfer failed; the message names the cause."""


def check_config(args: Any, *, max_lag: int = 1) -> None:
    """InputError naming every AsyncGRPOConfig setting under which AsyncGRPO's loss would not be
    rowgrove's, or under which the worker could not keep its micro-batches aligned."""
    problems = []
    if args.token_budget is None or args.token_budget > 0:
        problems.append(f"token_budget=0 (is {args.token_budget}: the token-budget batcher cuts micro-batches "
                        "by length, so no sample knows its micro-batch's divisor)")
    if args.weight_sync_steps != 1:
        problems.append(f"weight_sync_steps=1 (is {args.weight_sync_steps}: the worker waits for each step's version)")
    if args.max_staleness < max_lag:
        problems.append(f"max_staleness >= max_lag (are {args.max_staleness} and {max_lag}: AsyncGRPO would drop "
                        "samples and shift every later micro-batch)")
    if args.temperature != 1.0:
        problems.append(f"temperature=1.0 (is {args.temperature}: the trainer would score tokens at another "
                        "temperature than the engine's logprobs)")
    if problems:
        raise InputError("AsyncGRPO's loss would not be rowgrove's under this AsyncGRPOConfig; set " + "; ".join(problems))


def _row_scale(w: WeightedRow) -> float:
    """The row's one coefficient A x w over its trained tokens; InputError when w varies inside it."""
    mask = np.asarray(w.row.loss_mask) != 0
    coef = w.coef_T[mask]
    if coef.size and not np.allclose(coef, coef[0], rtol=1e-12, atol=0.0):
        raise InputError(f"row of rollout {w.row.rollout_id}: its loss weights vary across its tokens; AsyncGRPO "
                         "carries one advantage per sample (use loss_mode token-mean or rollout-mean)")
    return float(coef[0]) if coef.size else 0.0


def _trained_terms(mask: np.ndarray) -> int:
    """Loss terms AsyncGRPO takes over a sample: its trained tokens after the first position (packing.TreeRow.pack)."""
    return int(np.count_nonzero(mask[1:]))


def rows_to_samples(rows: Sequence[Row], *, microbatch_size: int, gradient_accumulation_steps: int,
                    model_version: int = 0, group_index: dict[str, int] | None = None,
                    loss_mode: str = "token-mean", estimator: str = "grpo", scale_by_std: bool = True,
                    pad_token_id: int = 0) -> list[RolloutSample]:
    """One update's rows as AsyncGRPO `RolloutSample`s, in queue order: rows of valid rollouts, then
    padding samples up to a multiple of `microbatch_size x gradient_accumulation_steps`.

    Promise: fed through AsyncGRPO's FixedCountBatcher (`per_device_train_batch_size =
    microbatch_size`, one process) into its loss, the summed gradient of the update equals
    rowgrove's (`weigh_rows`: advantage x loss weight on every sampled token). `group_index` maps
    rowgrove group ids to AsyncGRPO's int group ids (filled in place; a new dict when None)."""
    check_mode(loss_mode)
    if microbatch_size < 1 or gradient_accumulation_steps < 1:
        raise InputError(f"microbatch_size and gradient_accumulation_steps must be >= 1, got "
                         f"{microbatch_size} and {gradient_accumulation_steps}")
    weighted = weigh_rows(rows, loss_mode=loss_mode, estimator=estimator, scale_by_std=scale_by_std)
    groups = {} if group_index is None else group_index
    step = microbatch_size * gradient_accumulation_steps
    n = len(weighted.rows) + (-len(weighted.rows)) % step
    items: list[tuple[np.ndarray, np.ndarray, np.ndarray, float, int, dict[str, float]]] = []
    for w in weighted.rows:
        gid = groups.setdefault(str(w.row.group_id), len(groups))
        items.append((np.asarray(w.row.input_ids, np.int64), (np.asarray(w.row.loss_mask) != 0).astype(np.int64),
                      np.asarray(w.row.logprobs, np.float32), _row_scale(w), gid,
                      {"reward": float(w.row.reward), "rowgrove/segment": float(w.row.segment)}))
    pad_group = groups.setdefault("rowgrove/padding", len(groups))
    for _ in range(n - len(items)):
        items.append((np.full(2, pad_token_id, np.int64), np.array([0, 1], np.int64), np.zeros(2, np.float32),
                      0.0, pad_group, {}))
    samples: list[RolloutSample] = []
    for b in range(0, n, microbatch_size):
        chunk = items[b:b + microbatch_size]
        n_mb = sum(_trained_terms(m) for _, m, _, _, _, _ in chunk)
        for ids, mask, lp, scale, gid, metrics in chunk:
            samples.append(RolloutSample(
                prompt=[], completion=[], input_ids=ids, completion_mask=mask, old_log_probs=lp,
                advantage=scale * n_mb * gradient_accumulation_steps, model_version=model_version,
                group_id=gid, metrics=dict(metrics)))
    return samples


class RowgroveRolloutWorker:
    """AsyncGRPO's rollout worker (`RolloutWorkerProtocol`) whose samples are rowgrove rows.

    `rows_fn(prompts, worker)` gets one update's prompts (each of `prompts_per_step` dataset prompts
    repeated `args.num_generations` times, as AsyncGRPO's own worker samples them) and returns the
    rows of the finished rollouts (`rowgrove.integrations.harness.rollouts_to_rows` over a gateway
    makes it one line). `prompts` are cycled. Runs in a thread of the trainer's process; a failure
    in `rows_fn` stops it and `check_health` raises it in the trainer."""

    def __init__(self, args: Any, rows_fn: RowsFn, prompts: Sequence[Any], *, prompts_per_step: int = 1,
                 loss_mode: str = "token-mean", estimator: str = "grpo", scale_by_std: bool = True,
                 max_lag: int = 1, pad_token_id: int = 0):
        if max_lag < 1:
            raise InputError(f"max_lag must be >= 1, got {max_lag}: AsyncGRPO pulls the first micro-batch of step "
                             "k+1 before step k's weight sync, so a worker that waits for that sync never feeds it")
        check_config(args, max_lag=max_lag)
        check_mode(loss_mode)
        prompts = list(prompts)
        if not prompts or prompts_per_step < 1:
            raise InputError("give at least one prompt and prompts_per_step >= 1")
        self.rows_fn = rows_fn
        self.prompts = prompts
        self.prompts_per_step = prompts_per_step
        self.num_generations = int(args.num_generations)
        self.microbatch_size = int(args.per_device_train_batch_size)
        self.gradient_accumulation_steps = int(args.gradient_accumulation_steps)
        self.loss_mode, self.estimator, self.scale_by_std = loss_mode, estimator, scale_by_std
        self.max_lag = max_lag
        self.pad_token_id = pad_token_id
        self.rollout_buffer: queue.Queue[RolloutSample] = queue.Queue()
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue(maxsize=4096)
        self.group_index: dict[str, int] = {}
        self.steps_produced = 0
        self.last_rows: list[Row] = []
        self._version = 0
        self._base: int | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._producing = False  # rows_fn is running: one batch of rollouts may take minutes
        self._thread: threading.Thread | None = None
        self._next_prompt = 0

    @property
    def model_version(self) -> int:
        return self._version

    def update_model_version(self, model_version: int) -> None:
        with self._cond:
            self._version = int(model_version)
            self._cond.notify_all()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._base = self._version
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._run, name="rowgrove-async-grpo-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise AsyncGRPOError(f"the rowgrove rollout worker failed: {type(self._error).__name__}: "
                                 f"{self._error}") from self._error
        # While rows_fn runs, the worker is alive for as long as its thread is: a batch of long agent
        # rollouts is not a hang (AsyncGRPO's own worker beats from its event loop every 0.5 s
        # while generating, trl/experimental/async_grpo/async_rollout_worker.py). A rollout that
        # never returns is its HTTP client's timeout to end.
        thread = self._thread
        if self._producing and thread is not None and thread.is_alive():
            return
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise AsyncGRPOError(f"the rowgrove rollout worker produced nothing for {age:.1f} s (> {stale_after_s:g} s, heartbeat_stale_after_s): "
                                 "is the gateway answering, and is the trainer publishing weights?")

    def step_prompts(self) -> list[Any]:
        """The next update's prompt entries: `prompts_per_step` prompts, each `num_generations` times."""
        out = []
        for _ in range(self.prompts_per_step):
            p = self.prompts[self._next_prompt % len(self.prompts)]
            self._next_prompt += 1
            out += [p] * self.num_generations
        return out

    def produce(self) -> list[RolloutSample]:
        """Run one update's rollouts and lay their rows out as samples (no queueing)."""
        version = self._version
        self._producing = True
        try:
            rows = list(self.rows_fn(self.step_prompts(), self))
        finally:
            self._producing = False
            self._heartbeat = time.time()
        self.last_rows = rows
        samples = rows_to_samples(rows, microbatch_size=self.microbatch_size,
                                  gradient_accumulation_steps=self.gradient_accumulation_steps,
                                  model_version=version, group_index=self.group_index, loss_mode=self.loss_mode,
                                  estimator=self.estimator, scale_by_std=self.scale_by_std,
                                  pad_token_id=self.pad_token_id)
        versions = [v for r in rows if r.weight_versions is not None for v in r.weight_versions if v >= 0]
        metrics = {"rowgrove/rows": float(len(rows)),
                   "rowgrove/rollouts": float(len({r.rollout_id for r in rows})),
                   "rowgrove/samples": float(len(samples)),
                   "rowgrove/sampled_with_version": float(version)}
        if versions:
            metrics["rowgrove/engine_weight_version_min"] = float(min(versions))
            metrics["rowgrove/engine_weight_version_max"] = float(max(versions))
        try:
            self.metrics_queue.put_nowait(metrics)
        except queue.Full:
            pass
        return samples

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._cond:
                    while (not self._stop.is_set()
                           and self._version < (self._base or 0) + self.steps_produced - self.max_lag):
                        self._heartbeat = time.time()
                        self._cond.wait(timeout=1.0)
                if self._stop.is_set():
                    return
                for sample in self.produce():
                    sample.enqueued_at = time.time()
                    self.rollout_buffer.put(sample)
                self.steps_produced += 1
                self._heartbeat = time.time()
        except BaseException as e:  # noqa: BLE001 - surfaced to the trainer by check_health
            self._error = e
            traceback.print_exc()


class GatewayWeightTransfer:
    """AsyncGRPO's weight transfer (`WeightTransferProtocol`) into the gateway's engine, through
    rowgrove's one weight path (`rowgrove.integrations.gateway_sync.GatewaySync`): each sync
    writes the tensors AsyncGRPO streams as a checkpoint under `sync_dir` (with `config`, the
    model's transformers config, as its config.json), posts it to `POST {gateway_url}/v1/weights`,
    and raises `WeightSyncError` unless the gateway's version moved (a vLLM/SGLang engine also
    checks its servers' logprobs against the folder). With `reference` (the trainer model's
    log p(ids[i] | ids[:i]), e.g. `lambda ids: policy_logprobs(trainer.model, ids)`, settable
    after the trainer exists) every sync is also verified by `GatewaySync.verify`'s probe call
    against the trainer's own logprobs, as `RowgroveGRPOTrainer(gateway_url=...)` does.
    `sync_dir` must be readable by the gateway (and by its vLLM/SGLang servers)."""

    def __init__(self, gateway_url: str, sync_dir: str | Path, config: Any, *,
                 reference: Callable[[Sequence[int]], Sequence[float]] | None = None,
                 tolerance: float | None = None, admin_key: str | None = None, timeout: float = 600.0):
        from rowgrove.integrations.gateway_sync import GatewaySync

        self.sync = GatewaySync(gateway_url, sync_dir, tolerance=tolerance, admin_key=admin_key, timeout=timeout)
        self.config = config
        self.reference = reference
        self.versions: list[int] = []
        self.gaps: list[float] = []  # the probe's largest logprob gap per verified sync

    def init_weight_transfer(self) -> None:
        self.versions = [self.sync.version()]

    def pause(self) -> None:
        """Nothing: the engine applies an update between forward passes (vLLM: inside its own pause)."""

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        state = {name: t.detach().to("cpu").contiguous().clone() for name, t in iterator}
        if not state:
            raise AsyncGRPOError("AsyncGRPO streamed no tensors to send")
        version = self.sync.push(state, self.config)
        if self.reference is not None:
            gap, _n = self.sync.verify(self.reference, version, note="asyncgrpo")
            self.gaps.append(gap)
        self.versions.append(version)

    def resume(self) -> None:
        """Nothing (see `pause`)."""

    def destroy(self) -> None:
        """Nothing to release: `sync_dir` keeps the last synced weights."""


__all__ = ["AsyncGRPOError", "GatewayWeightTransfer", "RowgroveRolloutWorker", "check_config", "rows_to_samples"]
