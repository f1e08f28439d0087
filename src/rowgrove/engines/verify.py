"""Weight sync is verified, never assumed: after a server loads new weights, its logprobs on a
short probe are compared with the trainer's own, and a server that differs is refused.

Why: a server can answer 200 to a weight update and keep sampling, in part, from the old weights.
Measured with vLLM's CPU build: with tied embeddings and a checkpoint without `lm_head.weight`,
`reload_weights` refreshes every layer but the output layer (the CPU build keeps a pre-packed copy
of it, made when the weights were first processed, and the in-place reload re-processes only the
layers it loaded a tensor into). A trainer that syncs that way trains on rollouts sampled by a
policy it never had. The check turns that into an error naming the server, the version and the
largest difference, before any call is served by the stale server.

    expected = reference(probe_ids)      # the trainer's logprobs (a callable), or the engine's own
                                         # CPU mirror of what it sent (`WeightMirror`)
    got      = server's logprob of each probe token after its prefix (vLLM: prompt_logprobs)
    refuse when max |got - expected| > tolerance
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rowgrove.errors import EngineError, InputError

# Largest |server - trainer| logprob difference accepted on the probe. fp32 on both sides agrees
# within ~1e-6 (measured with vLLM's CPU build); a bf16 server against an fp32 trainer needs ~0.1.
DEFAULT_SYNC_TOLERANCE = 1e-3
TOLERANCE_ENV = "ROWGROVE_SYNC_TOLERANCE"

Reference = Callable[[Sequence[int]], Sequence[float]]


class WeightSyncError(EngineError):
    """A server's logprobs after a weight update differ from the trainer's beyond the tolerance."""


def sync_tolerance(value: float | None = None) -> float:
    """The tolerance to use: `value`, else $ROWGROVE_SYNC_TOLERANCE, else DEFAULT_SYNC_TOLERANCE.
    InputError when it is not a number >= 0 (`inf` turns the check off, explicitly)."""
    raw: Any = value if value is not None else os.environ.get(TOLERANCE_ENV, DEFAULT_SYNC_TOLERANCE)
    try:
        tol = float(raw)
    except (TypeError, ValueError):
        raise InputError(f"sync tolerance {raw!r} is not a number: give the largest logprob difference "
                         f"accepted after a weight sync (default {DEFAULT_SYNC_TOLERANCE})") from None
    if math.isnan(tol) or tol < 0:
        raise InputError(f"sync tolerance {raw!r} must be >= 0 (inf turns the check off)")
    return tol


def policy_logprobs(model: Any, ids: Sequence[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 under `model` (a causal LM), fp32 log_softmax of the
    raw logits: what vLLM's `prompt_logprobs` reports for the same ids."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(ids)], device=device), use_cache=False).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(list(ids[1:]), device=device)[:, None])[:, 0].tolist()


def largest_difference(expected: Sequence[float], got: Sequence[float]) -> tuple[float, int]:
    """(max |got - expected|, the probe position where it is); inf when the lengths differ or a
    value is not finite."""
    if len(expected) != len(got):
        return math.inf, min(len(expected), len(got))
    worst, where = 0.0, -1
    for i, (a, b) in enumerate(zip(expected, got, strict=True)):
        d = abs(float(a) - float(b)) if b is not None else math.inf
        if not math.isfinite(d):
            return math.inf, i
        if d > worst:
            worst, where = d, i
    return worst, where


class WeightMirror:
    """A CPU fp32 copy of the served model that takes every update the servers take (a state
    dict, or the tensors of a checkpoint folder, loaded over what it held: a subset updates only
    those tensors, as a server's in-place reload does). It is the reference when the caller gives
    none. Loaded on first use from the model folder; for a large model, pass the trainer's own
    logprobs to `update_weights(..., reference=)` instead of holding this copy."""

    def __init__(self, model_path: Path):
        self.model_path = Path(model_path)
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            import torch
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(str(self.model_path), dtype=torch.float32).eval()
        return self._model

    def apply(self, weights: Mapping[str, Any] | Path) -> None:
        """Load `weights` (a state dict or a checkpoint folder of *.safetensors) over the copy.
        EngineError when a tensor name is not the model's."""
        model = self._load()
        tensors: Mapping[str, Any]
        if isinstance(weights, Path):
            from safetensors.torch import load_file

            files = sorted(weights.glob("*.safetensors")) if weights.is_dir() else [weights]
            loaded: dict[str, Any] = {}
            for f in files:
                loaded.update(load_file(str(f)))
            tensors = loaded
        else:
            tensors = weights
        own = model.state_dict()
        unknown = sorted(k for k in tensors if k not in own)
        if unknown:
            raise EngineError(f"the weights name tensors the model {self.model_path} does not have "
                              f"({', '.join(unknown[:4])}): sync the trainer's own state dict")
        import torch

        with torch.no_grad():
            for k, v in tensors.items():
                own[k].copy_(v.to(own[k].dtype))

    def logprobs(self, ids: Sequence[int]) -> list[float]:
        return policy_logprobs(self._load(), ids)


def tied_without_head(folder: Path) -> bool:
    """Whether `folder` is a checkpoint of a model with tied embeddings (config.json
    `tie_word_embeddings`) whose safetensors hold no `lm_head.weight`: the layout vLLM's CPU build
    reloads with a stale output layer (see the module docstring)."""
    import json

    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    if not text_cfg.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)):
        return False
    from safetensors import safe_open

    for f in folder.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            if any(k.endswith("lm_head.weight") for k in st.keys()):  # noqa: SIM118 - safe_open has no __iter__
                return False
    return True


def with_tied_head(state_dict: Mapping[str, Any], config_path: Path) -> dict[str, Any]:
    """`state_dict`, plus `lm_head.weight` (the input embedding) when the model ties its
    embeddings and the dict lacks it: vLLM reloads the output layer only from a checkpoint that
    names it (its CPU build otherwise keeps a stale pre-packed copy; on other builds it is the
    same tensor either way)."""
    import json

    out = dict(state_dict)
    if "lm_head.weight" in out:
        return out
    try:
        cfg = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return out
    if not cfg.get("tie_word_embeddings", False):
        return out
    embed = [k for k in out if k.endswith("embed_tokens.weight")]
    if len(embed) == 1 and embed[0] == "model.embed_tokens.weight":
        out["lm_head.weight"] = out[embed[0]]
    return out
