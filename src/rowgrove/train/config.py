"""The trainer's configuration: one frozen dataclass, one line of documentation per field, filled
from a YAML file and `key=value` overrides (the CLI is a thin shell over `load_config`).

Nothing here has behaviour beyond parsing and checking: the loop reads the fields, never the YAML.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rowgrove.algo import ESTIMATORS
from rowgrove.errors import InputError

LOSS_MODES = ("token-mean", "rollout-mean")
ENGINES = ("hf", "vllm", "sglang")


@dataclass(frozen=True)
class TrainConfig:
    """One GRPO run. Every field has a default that runs the CPU demo."""

    model: str = "tiny-task"
    """Model spec: "tiny-task" (tiny model built with the env's corpus), "tiny", or a HF model dir."""
    device: str = "cpu"
    """Torch device of the policy, and of the engine when it is hf ("cpu", "cuda", "cuda:1")."""
    engine: str = "hf"
    """Who samples the rollouts: hf (a copy of the policy in this process), vllm or sglang (running
    servers at engine_url that serve the model folder; weights synced after every step)."""
    engine_url: str | None = None
    """The vllm/sglang server(s), comma-separated (a rollout's calls stay on one server)."""
    sync_tolerance: float = 1e-3
    """vllm/sglang: after each weight sync the server's logprobs on a probe must equal the trainer's
    within this (largest absolute difference), else the run stops naming the server (inf: no check)."""
    off_policy_steps: int = 0
    """0: each step trains on rollouts sampled with its own weights; 1: the next step's rollouts
    are sampled while this step trains (one step off-policy; pair it with max_staleness)."""
    dtype: str | None = None
    """Parameter dtype for a HF model dir (e.g. "bfloat16"); None keeps the checkpoint's."""
    tiny_layers: int = 2
    """Layers of the tiny model (model "tiny-task" only)."""
    tiny_hidden: int = 64
    """Hidden size of the tiny model (model "tiny-task" only)."""
    env: str = "counter"
    """Task name in rowgrove.envs (a learnable, tool-using task)."""
    agent: Mapping[str, Any] = field(default_factory=dict)
    """Agent options passed to rowgrove.agents (compaction policy, max turns, max retries...)."""
    prompts_per_step: int = 8
    """Distinct prompts (groups) sampled per step."""
    rollouts_per_prompt: int = 8
    """Rollouts per prompt: the GRPO group size."""
    steps: int = 20
    """GRPO steps to run (a step = one batch of groups)."""
    lr: float = 3e-3
    """AdamW learning rate (peak, after warm-up of the schedule)."""
    lr_warmup_steps: int = 0
    """Optimizer updates of linear LR warm-up."""
    lr_decay_to: float = 1.0
    """LR at the run's last update as a fraction of `lr`, reached linearly after the warm-up (1.0: constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping norm per optimizer update (0 disables)."""
    estimator: str = "grpo"
    """Advantage estimator passed to rowgrove.algo.assign_advantages (grpo | rloo | dr_grpo)."""
    scale_by_std: bool = True
    """Divide advantages by the group's reward std (GRPO); False is Dr. GRPO's choice."""
    loss_mode: str = "token-mean"
    """How tokens are weighed inside one optimizer update: token-mean | rollout-mean."""
    rollouts_per_minibatch: int = 32
    """Whole rollouts per optimizer update; updates per step = ceil(rollouts / this)."""
    microbatch_tokens: int = 4096
    """Token capacity of one packed micro-batch (gradient accumulation over micro-batches)."""
    packed: bool = True
    """Pack rows into micro-batches (varlen attention); False pads rows (the benchmark baseline)."""
    clip_eps: float = 0.2
    """PPO clip range: ratio is clipped to [1 - eps, 1 + eps]."""
    kl_coef: float = 0.0
    """GRPO's KL penalty to the starting (warmed) policy, k3 estimator per trained token; 0 disables."""
    max_staleness: int | None = None
    """None: never mask; k: rollouts whose oldest trained token is more than k weight versions
    behind the policy are masked whole, mask_reason 'stale' (rowgrove.algo.mask_stale)."""
    temperature: float = 1.0
    """Sampling temperature of the engine during rollouts."""
    max_tokens: int = 48
    """Most tokens the engine samples per call."""
    warmup_sft_steps: int = 60
    """Supervised warm-up steps on synthetic transcripts before GRPO (0 skips)."""
    warmup_policy: str = "random"
    """Scripted policy of the warm-up transcripts (rowgrove.envs POLICIES): "random" teaches the
    tool-call format only, so the task skill measured after GRPO comes from RL."""
    warmup_sft_lr: float = 3e-3
    """Learning rate of the supervised warm-up."""
    warmup_sft_batch: int = 16
    """Transcripts per supervised warm-up step."""
    eval_prompts: int = 32
    """Prompts evaluated (one rollout each) before GRPO and after it; 0 skips evaluation."""
    eval_every: int = 0
    """Also evaluate after every K-th step (the same prompts and sampling seeds each time, so the
    curve moves only with the policy); recorded as `eval_reward` in that step's metrics. 0: only
    before and after."""
    checkpoint_every: int = 5
    """Save a checkpoint every K steps (and after the last step); 0 saves only at the end."""
    seed: int = 0
    """Seed for prompts, sampling, mini-batch order, model init."""
    out: str = "runs/demo"
    """Run directory: metrics.jsonl, ledger.sqlite, checkpoint/, plots, report.html."""
    concurrency: int = 64
    """Most rollouts in flight at once against the gateway."""
    threads: int = 0
    """torch.set_num_threads for the single process (0 leaves torch's default)."""
    progress: bool = True
    """Show a tqdm progress bar with the running reward."""
    ray: bool = False
    """Run the rollouts on Ray (rowgrove.scale.GatewayPool: `gateways` gateway actors, each with
    its own engine and ledger; episodes as Ray tasks). Needs the `ray` extra."""
    gateways: int = 2
    """Gateway actors with `ray` (each an engine copy with engine hf, else a share of engine_url)."""
    ray_address: str | None = None
    """The Ray cluster to join with `ray` ("auto", "ray://head:10001"); None starts a local Ray."""

    def __post_init__(self) -> None:
        problems = []
        if self.estimator not in ESTIMATORS:
            problems.append(f"estimator={self.estimator!r} (use one of {', '.join(ESTIMATORS)})")
        if self.loss_mode not in LOSS_MODES:
            problems.append(f"loss_mode={self.loss_mode!r} (use one of {', '.join(LOSS_MODES)})")
        for name in ("prompts_per_step", "rollouts_per_prompt", "rollouts_per_minibatch",
                     "microbatch_tokens", "max_tokens", "concurrency", "gateways"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} (must be >= 1)")
        for name in ("steps", "warmup_sft_steps", "checkpoint_every", "eval_prompts", "eval_every",
                     "lr_warmup_steps"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} (must be >= 0)")
        if self.eval_every and not self.eval_prompts:
            problems.append(f"eval_every={self.eval_every} with eval_prompts=0 (set eval_prompts >= 1 to "
                            "evaluate, or eval_every=0)")
        if not 0 <= self.lr_decay_to <= 1:
            problems.append(f"lr_decay_to={self.lr_decay_to} (must be in [0, 1])")
        if self.kl_coef < 0:
            problems.append(f"kl_coef={self.kl_coef} (must be >= 0)")
        if self.engine not in ENGINES:
            problems.append(f"engine={self.engine!r} (use one of {', '.join(ENGINES)})")
        elif self.engine != "hf" and not self.engine_url:
            problems.append(f"engine={self.engine} needs engine_url, the address of the server (--engine-url)")
        if not self.sync_tolerance >= 0:
            problems.append(f"sync_tolerance={self.sync_tolerance} (must be >= 0; inf turns the check off)")
        if self.off_policy_steps not in (0, 1):
            problems.append(f"off_policy_steps={self.off_policy_steps} (must be 0 or 1)")
        if self.max_staleness is not None and self.max_staleness < 0:
            problems.append(f"max_staleness={self.max_staleness} (must be >= 0, or None never to mask)")
        if not 0 <= self.clip_eps < 1:
            problems.append(f"clip_eps={self.clip_eps} (must be in [0, 1))")
        if problems:
            raise InputError("bad training config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict of every field."""
        d = dataclasses.asdict(self)
        d["agent"] = dict(self.agent)
        return d

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with some fields changed (checked like any other config)."""
        return dataclasses.replace(self, **changes)


def config_hash(d: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-able mapping (used to cache warmed models)."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _yaml_value(raw: str, key: str) -> Any:
    """A `key=value` override's value parsed as YAML; InputError naming the key if it is not YAML."""
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise InputError(f"config field {key}: {raw!r} is not valid YAML ({problem}): quote the value, "
                         f"e.g. --set '{key}=\"...\"'") from None


def _coerce(name: str, raw: Any, current: Any, annotation: str) -> Any:
    """Turn a YAML value or a `--set` string into the field's type."""
    if isinstance(raw, str) and annotation != "str":
        raw = _yaml_value(raw, name) if raw != "" else None
    if annotation == "bool":
        if not isinstance(raw, bool):
            raise InputError(f"config field {name} is true/false, got {raw!r}")
        return raw
    if annotation == "int":
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise InputError(f"config field {name} is an integer, got {raw!r}")
        return raw
    if annotation == "int | None":
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise InputError(f"config field {name} is an integer or null, got {raw!r}")
        return raw
    if annotation == "float":
        if isinstance(raw, str):
            try:
                raw = float(raw)
            except ValueError:
                pass
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise InputError(f"config field {name} is a number, got {raw!r}")
        return float(raw)
    if annotation.startswith("Mapping"):
        if not isinstance(raw, Mapping):
            raise InputError(f"config field {name} is a mapping, got {raw!r}")
        return {**dict(current), **dict(raw)}
    if annotation == "str | None":
        return None if raw is None else str(raw)
    return str(raw)


def load_config(path: str | Path | None = None, overrides: Iterable[str] | Mapping[str, Any] = (),
                base: TrainConfig | None = None) -> TrainConfig:
    """`base` (default TrainConfig()) updated by the YAML file at `path`, then by `overrides`
    (`"key=value"` strings whose values are parsed as YAML, or a mapping). A dotted key such as
    `agent.policy=keep-last` sets one entry of a mapping field. Unknown keys raise InputError
    naming them and the known fields."""
    cfg = base or TrainConfig()
    known = {f.name: f for f in fields(TrainConfig)}
    values: dict[str, Any] = {}

    def put(key: str, raw: Any, origin: str) -> None:
        head, _, sub = key.partition(".")
        if head not in known:
            raise InputError(f"unknown config field {key!r} in {origin}: known fields are {', '.join(known)}")
        current = values.get(head, getattr(cfg, head))
        if sub:
            if not known[head].type.startswith("Mapping"):
                raise InputError(f"config field {head} is not a mapping: write {head}=VALUE")
            raw = {sub: _yaml_value(raw, key) if isinstance(raw, str) else raw}
        values[head] = _coerce(head, raw, current, str(known[head].type))

    if path is not None:
        import yaml

        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except OSError as e:
            raise InputError(f"cannot read config {p}: {e.strerror}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{p}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(p)
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise InputError(f"config {where} is not valid YAML ({problem}): fix the file there") from None
        if not isinstance(data, Mapping):
            raise InputError(f"config {p} must be a YAML mapping of field: value")
        for k, v in data.items():
            put(str(k), v, str(p))
    items = overrides.items() if isinstance(overrides, Mapping) else []
    if not isinstance(overrides, Mapping):
        parsed = []
        for o in overrides:
            k, eq, v = o.partition("=")
            if not eq or not k:
                raise InputError(f"override {o!r} is not key=value: write e.g. lr=0.001")
            parsed.append((k.strip(), v))
        items = parsed
    for k, v in items:
        put(k, v, "overrides")
    return dataclasses.replace(cfg, **values)
