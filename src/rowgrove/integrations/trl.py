"""rowgrove rows into TRL's GRPOTrainer (`pip install 'rowgrove[trl]'`, trl 1.16.0).

    trainer = RowgroveGRPOTrainer(model, args=GRPOConfig(loss_type="dapo", beta=0.0, ...),
                                  rows_fn=rows_fn, train_dataset=prompts, processing_class=tok)
    trainer.train()

`rows_fn(prompts, trainer) -> list[rowgrove.types.Row]` returns the rows of the finished rollouts
of one generation batch (from a gateway: any number of rows per rollout, any group sizes,
explicit group ids; `rowgrove.integrations.harness.rollouts_to_rows` makes it one line).

Why a subclass: TRL's `rollout_func` must return exactly one completion per prompt entry, and
GRPOTrainer computes advantages as `rewards.view(-1, num_generations)` (positional groups, no
group id) with no way to supply them; the maintainers advise overriding
`_generate_and_score_completions` (trl#4525). This class overrides it: the generation batch is
`rows_fn`'s rows, each row one TRL sequence (prompt = tokens before its first generated token,
completion = the rest; `tool_mask` = the row's loss mask, so tool output inside the completion
is context, not trained), `old_per_token_logps` = the engine's logprobs (the ratio is against the
sampler, as in rowgrove's own update), and the advantage of completion token t of row i is

    advantages[i, t] = A_rollout(i) * w[i][t]

with A from `rowgrove.algo.assign_advantages` and w from `rowgrove.algo.loss_weights(rows, mode)`.
TRL accepts (B, T) advantages. With `loss_type="dapo"` TRL's loss is
`sum(per_token_loss * mask) / normalizer`, `normalizer = num_items_in_batch / num_processes *
current_gradient_accumulation_steps / steps_per_generation`; this class sets `num_items_in_batch`
so the normalizer is exactly 1 (the constant C = 1), so the gradient accumulated over the
generation batch is rowgrove's, however TRL shuffles and cuts the rows into micro-batches. The
other loss types divide per sequence (grpo, sapo, luspo), per micro-batch (bnpo) or by a fixed
completion length (dr_grpo), or reweigh tokens (cispo, vespo); they are refused.

Also refused, each because it would add or reweigh terms rowgrove's loss does not have: beta != 0
(KL to a reference), an entropy bonus, top_entropy_quantile < 1, off_policy_mask_threshold,
delta (two-sided clipping), importance_sampling_level="sequence", use_vllm (generation happens
behind the gateway; accepted only as TRL's vLLM server behind `gateway_url`, below),
steps_per_generation != gradient_accumulation_steps (TRL would cut one
generation batch into several optimizer steps by rows), and more than one process (the weights'
divisors are per process here). Rows are padded to a multiple of steps_per_generation with empty
rows (mask 0: they add nothing) because TRL's split drops a remainder.

On-policy (`gateway_url=URL`): the engine behind the gateway rows_fn's agents talk to takes the
trainer's weights at the start of `train()`, after every optimizer step (a TrainerCallback's
`on_step_end`, so the next generation batch is sampled by the updated policy) and at its end,
through the gateway's own weight route, and each sync is verified by a probe call whose sampled
logprobs must equal the trainer's (`rowgrove.integrations.gateway_sync`). A sync that fails or
differs raises `WeightSyncError` and training stops. Without `gateway_url` nothing keeps the
sampler in step: the trainer warns once, and the metrics below show the drift. A PEFT model
(TRL's `peft_config`) is synced as base weights with its LoRA-family adapters merged in, under the
base model's names (`gateway_sync.engine_weights`); a prompt-learning adapter is refused.

With TRL's own vLLM server (`use_vllm=True, vllm_mode="server"`, and `gateway_url` of a gateway
whose vllm engine points at that same server), TRL moves the weights itself: `sync_weights()`
(NCCL, GPU only) runs where TRL's `_generate` would run it, before each generation batch when
the step moved, then the new version is announced to the gateway and the same probe verifies it.

Logged every step, in TRL's metrics: `rowgrove/weight_version_lag` (trainer step minus the step
whose weights sampled the oldest trained token of the step's rows; 0 when synced),
`rowgrove/max_logprob_gap` (the largest |engine logprob - trainer logprob| over the sampled
tokens of the step's first micro-batch, from the logprobs TRL's own loss computes; ~1e-6 when
synced in fp32), and with `gateway_url` `rowgrove/sync_gap` and `rowgrove/sync_seconds` of the
sync that followed the step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rowgrove.engines.verify import WeightSyncError, policy_logprobs
from rowgrove.errors import InputError
from rowgrove.integrations.gateway_sync import GatewaySync, SyncRecord, engine_weights
from rowgrove.integrations.weighting import check_mode, padded_layout, weigh_rows
from rowgrove.types import Row

LOSS_TYPE = "dapo"

try:
    from transformers import TrainerCallback
    from trl import GRPOTrainer as _GRPOTrainer
except ImportError as e:  # the extra is not installed
    raise ImportError("rowgrove.integrations.trl needs TRL: pip install 'rowgrove[trl]' (trl==1.16.0)") from e


def _no_reward(*args: Any, **kwargs: Any) -> list[float]:
    raise InputError("RowgroveGRPOTrainer takes rewards from the rows (one per rollout), never from reward "
                     "functions; this placeholder should not be called")


NO_SYNC_WARNING = ("RowgroveGRPOTrainer without gateway_url: nothing keeps the engine behind the gateway on the "
                   "trainer's weights, so from the second step on rows are sampled by a policy the trainer left "
                   "behind (see rowgrove/weight_version_lag and rowgrove/max_logprob_gap). Pass gateway_url= the "
                   "gateway rows_fn's agents talk to")


def check_config(args: Any, gateway_url: str | None = None) -> None:
    """InputError naming every GRPOConfig setting under which TRL's loss would not be rowgrove's
    (or, with `use_vllm`, under which the sampler could not be kept in step)."""
    problems = []
    if args.loss_type != LOSS_TYPE:
        problems.append(f"loss_type='{LOSS_TYPE}' (is {args.loss_type!r}: it divides per sequence, per "
                        "micro-batch or by a fixed length, or reweighs tokens)")
    if args.beta != 0.0:
        problems.append("beta=0.0 (a KL term is not part of rowgrove's loss)")
    if getattr(args, "entropy_coef", 0.0) or getattr(args, "use_adaptive_entropy", False):
        problems.append("entropy_coef=0.0 and no adaptive entropy")
    if args.top_entropy_quantile < 1.0:
        problems.append("top_entropy_quantile=1.0")
    if args.off_policy_mask_threshold is not None:
        problems.append("off_policy_mask_threshold=None")
    if args.delta is not None:
        problems.append("delta=None (two-sided clipping)")
    if args.importance_sampling_level != "token":
        problems.append("importance_sampling_level='token'")
    if args.use_vllm and (args.vllm_mode != "server" or not gateway_url):
        problems.append("use_vllm=False (generation happens behind the rowgrove gateway), or use_vllm=True only with "
                        f"vllm_mode='server' (is {args.vllm_mode!r}) and gateway_url= a gateway whose vllm engine "
                        f"points at that server (is {gateway_url!r}): TRL then moves the weights, the gateway samples")
    if args.steps_per_generation != args.gradient_accumulation_steps:
        problems.append(f"steps_per_generation == gradient_accumulation_steps (are {args.steps_per_generation} and "
                        f"{args.gradient_accumulation_steps}: TRL would cut one batch of rows into several updates)")
    if problems:
        raise InputError("TRL's loss would not be rowgrove's under this GRPOConfig; set " + "; ".join(problems))


class RowgroveGRPOTrainer(_GRPOTrainer):
    """GRPOTrainer whose generation batch is rowgrove rows and whose loss is rowgrove's.

    `rows_fn(prompts, trainer)` gets the generation batch's prompts (each dataset prompt repeated
    `num_generations` times, as TRL samples them) and returns rows of finished rollouts.
    `loss_mode` ("token-mean" | "rollout-mean"), `estimator` and `scale_by_std` are
    `rowgrove.algo`'s. `gateway_url`: the gateway rows_fn's agents talk to; its engine is kept on
    the trainer's weights (module docstring), through checkpoints in `sync_dir` (default
    OUTPUT_DIR/rowgrove-weights; the gateway must read it under the same path), each sync
    verified within `sync_tolerance` (default 1e-3, $ROWGROVE_SYNC_TOLERANCE); `admin_key`: the
    gateway's, when it has one. Other keyword arguments go to GRPOTrainer (callbacks,
    optimizers, ...); `reward_funcs` are not taken: the reward is the rollout's, on its rows.
    """

    def __init__(self, model: Any, args: Any, rows_fn: Callable[[list[Any], Any], Sequence[Row]], *,
                 train_dataset: Any = None, processing_class: Any = None, loss_mode: str = "token-mean",
                 estimator: str = "grpo", scale_by_std: bool = True, gateway_url: str | None = None,
                 sync_dir: str | Path | None = None, sync_tolerance: float | None = None,
                 admin_key: str | None = None, **kwargs: Any):
        check_mode(loss_mode)
        check_config(args, gateway_url)
        if "reward_funcs" in kwargs or "rollout_func" in kwargs:
            raise InputError("RowgroveGRPOTrainer takes rows from rows_fn: do not pass reward_funcs or rollout_func")
        self.rows_fn = rows_fn
        self.loss_mode = loss_mode
        self.estimator = estimator
        self.scale_by_std = scale_by_std
        # the sampler: None = nothing keeps it in step (warned below)
        self.sampler = (GatewaySync(gateway_url, sync_dir or Path(args.output_dir) / "rowgrove-weights",
                                    tolerance=sync_tolerance, admin_key=admin_key) if gateway_url else None)
        self.syncs: list[tuple[int, SyncRecord]] = []  # (trainer step, the verified sync after it)
        self._synced_step: int | None = None
        self._base_version: int | None = None  # weight version = base + the trainer step that wrote it
        self._gap_pending = False  # the next micro-batch is its generation batch's first
        self._captured_logps: Any = None
        super().__init__(model=model, reward_funcs=[_no_reward], args=args, train_dataset=train_dataset,
                         processing_class=processing_class, **kwargs)
        if self.accelerator.num_processes > 1:
            raise InputError(f"RowgroveGRPOTrainer runs in one process (got {self.accelerator.num_processes}): "
                             "the loss weights' divisors would be per process")
        if self._entropy_bonus_enabled:
            raise InputError("TRL's loss would not be rowgrove's: set entropy_coef=0.0")
        self.last_rows: list[Row] = []
        if self.sampler is None:
            warnings.warn(NO_SYNC_WARNING, stacklevel=2)
        self.add_callback(_KeepSamplerInStep(self))

    # ---- the sampler: in step with the trainer's weights ----------------------------------------

    def trainer_logprobs(self, ids: Sequence[int]) -> list[float]:
        """The trainer model's log p(ids[i] | ids[:i]), i >= 1 (eval mode, no gradient): what the
        engine's logprobs of the same tokens must equal after a sync."""
        model = self.accelerator.unwrap_model(self.model)
        was = model.training
        model.eval()
        try:
            return policy_logprobs(model, ids)
        finally:
            model.train(was)

    def sync_sampler(self, when: str) -> SyncRecord | None:
        """Move the trainer's weights to the gateway's engine and verify them (`when`: "start",
        "step" or "end"). Nothing to do without a gateway, at the end when the last step's sync
        stands, or, with TRL's vLLM server, except at the end (TRL syncs before each generation:
        `_generate_and_score_completions`). Raises WeightSyncError: training stops."""
        step = int(self.state.global_step)
        if self.sampler is None or (when == "end" and self._synced_step == step
                                    and not self.args.load_best_model_at_end):
            return None
        if self.use_vllm:
            if when != "end":
                return None
            return self._sync_trl_vllm()
        model = self.accelerator.unwrap_model(self.model)
        # a PEFT model's adapters are merged in while the checkpoint is written and probed
        with engine_weights(model) as weights:
            rec = self.sampler.sync(weights, model.config, self.trainer_logprobs, note=f"{when} {step}")
        return self._synced(step, rec)

    def _sync_trl_vllm(self) -> SyncRecord:
        """TRL's own weight transfer to its vLLM server (`VLLMGeneration.sync_weights`, NCCL),
        then the new version announced to the gateway (whose vllm engine samples from that server)
        and verified by the probe."""
        import time

        from trl.extras.profiling import profiling_context

        assert self.sampler is not None
        t0 = time.perf_counter()
        with profiling_context(self, "sync_weights"):
            self.vllm_generation.sync_weights()
        self._last_loaded_step = self.state.global_step
        version = self.sampler.announce()
        gap, n = self.sampler.verify(self.trainer_logprobs, version, note=f"trl vllm {self.state.global_step}")
        return self._synced(int(self.state.global_step),
                            SyncRecord(version=version, gap=gap, probe_tokens=n, seconds=time.perf_counter() - t0))

    def _synced(self, step: int, rec: SyncRecord) -> SyncRecord:
        if self._base_version is None:
            self._base_version = rec.version - step
        self._synced_step = step
        self.syncs.append((step, rec))
        self._metrics["train"]["rowgrove/sync_gap"].append(rec.gap)
        self._metrics["train"]["rowgrove/sync_seconds"].append(rec.seconds)
        return rec

    def _log_version_lag(self, rows: Sequence[Row], mode: str) -> None:
        """rowgrove/weight_version_lag: the trainer step minus the step whose weights sampled the
        oldest trained token of `rows`. Without a gateway the first batch's oldest version counts
        as step 0. Nothing is logged when the rows carry no versions."""
        versions = [int(v) for r in rows if r.weight_versions is not None
                    for v, m in zip(r.weight_versions, r.loss_mask, strict=True) if m and v >= 0]
        if not versions:
            return
        step = int(self.state.global_step)
        if self._base_version is None:
            self._base_version = min(versions) - step
        self._metrics[mode]["rowgrove/weight_version_lag"].append(float(step - (min(versions) - self._base_version)))

    # ---- the generation batch: rows -------------------------------------------------------------

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        mode = "train" if self.model.training else "eval"
        if self.use_vllm and self.state.global_step != self._last_loaded_step:
            self._sync_trl_vllm()  # where TRL's _generate would call sync_weights()
        prompts = [x.get("prompt") for x in inputs]
        rows = list(self.rows_fn(prompts, self))
        self.last_rows = rows
        weighted = weigh_rows(rows, loss_mode=self.loss_mode, estimator=self.estimator, scale_by_std=self.scale_by_std)
        pad = int(self._tokenizer.pad_token_id or 0)
        kept = weighted.rows
        S = self.args.steps_per_generation if self.model.training else 1
        n = len(kept) + (-len(kept)) % S
        P = max(w.start for w in kept)
        T = max(len(w.row.input_ids) - w.start for w in kept)
        lay = padded_layout(kept, pad=pad, prompt_len=P, response_len=T, n_rows=n)
        prompt_ids, prompt_mask = lay["prompts"], lay["prompt_mask"]
        completion_ids, completion_mask, tool_mask = lay["responses"], lay["response_attention"], lay["loss_mask"]
        adv, old = lay["coef"], lay["logprobs"]
        prompt_mask[len(kept):, -1] = 1  # padding rows: one pad token of context, nothing trained
        dev = self.accelerator.device

        def t(a: np.ndarray, dtype: Any) -> Any:
            return torch.as_tensor(a, dtype=dtype, device=dev)

        self._metrics[mode]["rowgrove/rows"].append(float(len(kept)))
        self._metrics[mode]["rowgrove/rollouts"].append(float(len(weighted.rollout_ids)))
        self._metrics[mode]["rowgrove/dropped_invalid_rows"].append(float(weighted.dropped_invalid))
        rewards = {w.row.rollout_id: float(w.row.reward) for w in kept}
        self._metrics[mode]["reward"].append(float(np.mean(list(rewards.values()))))
        self._log_version_lag([w.row for w in kept], mode)
        self._gap_pending = mode == "train"
        return {
            "prompt_ids": t(prompt_ids, torch.long), "prompt_mask": t(prompt_mask, torch.long),
            "completion_ids": t(completion_ids, torch.long), "completion_mask": t(completion_mask, torch.long),
            "tool_mask": t(tool_mask, torch.long), "advantages": t(adv, torch.float32),
            "old_per_token_logps": t(old, torch.float32),
            "num_items_in_batch": t(np.asarray(1.0), torch.float32),  # replaced in _compute_loss
        }

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        """TRL's own loss with its "dapo" normalizer set to 1: num_items_in_batch = num_processes *
        steps_per_generation / current_gradient_accumulation_steps (train) or num_processes (eval)."""
        import torch

        procs = self.accelerator.num_processes
        if self.model.training:
            items = procs * self.args.steps_per_generation / self.current_gradient_accumulation_steps
        else:
            items = procs
        inputs = {**inputs, "num_items_in_batch": torch.tensor(float(items), device=self.accelerator.device)}
        first = self.model.training and self._gap_pending
        self._gap_pending = False
        self._captured_logps = None
        try:
            self._capture_logps = first
            loss = super()._compute_loss(model, inputs)
        finally:
            self._capture_logps = False
        if first and self._captured_logps is not None:
            # rowgrove/max_logprob_gap: the engine's logprobs (old_per_token_logps) against the ones
            # TRL's loss just computed, on the sampled tokens of the first micro-batch
            mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
            diff = (self._captured_logps.float() - inputs["old_per_token_logps"]).abs()[mask]
            self._metrics["train"]["rowgrove/max_logprob_gap"].append(float(diff.max()) if diff.numel() else 0.0)
            self._captured_logps = None
        return loss

    _capture_logps = False

    def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's own, keeping (detached) the logprobs of the first micro-batch for the gap metric."""
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._capture_logps:
            self._captured_logps = out[0].detach()
        return out


class _KeepSamplerInStep(TrainerCallback):
    """Syncs the trainer's weights to the gateway's engine when training starts, after every
    optimizer step (before the next generation batch) and when it ends. An error raised here
    propagates out of `train()`: training stops."""

    def __init__(self, trainer: RowgroveGRPOTrainer):
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.sync_sampler("start")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.sync_sampler("step")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.sync_sampler("end")


__all__ = ["LOSS_TYPE", "NO_SYNC_WARNING", "RowgroveGRPOTrainer", "WeightSyncError", "check_config"]
