"""Inference engines behind one protocol (`rowgrove.engines.base.Engine`): prompt token ids in,
sampled token ids + their logprobs + the weight version of each token + a finish reason out.

    make_engine("scripted", "tiny")                 deterministic replies, real teacher-forced logprobs
    make_engine("hf", "tiny" | PATH)                local transformers generation, requests batched
    make_engine("vllm", PATH, url=URL)              a vLLM server (/v1/completions on token ids)
    make_engine("sglang", PATH, url=URL)            an SGLang server (/generate on input_ids)

For the two servers, PATH is the Hugging Face model folder the server serves: rowgrove renders and
tokenizes with it, the server only samples from token ids (see `rowgrove.engines.remote` and
docs/engines.md for the flags to start each server with; `rowgrove.engines.launch` starts a real
`vllm serve` with them). Every weight sync to a server is verified against the trainer's logprobs
on a probe (`rowgrove.engines.verify`).
"""

from __future__ import annotations

from typing import Any

from rowgrove.engines.base import Engine, Generation, SamplingParams
from rowgrove.errors import InputError

__all__ = ["Engine", "Generation", "SamplingParams", "make_engine"]


REMOTE_OPTIONS = {"url", "timeout", "api_key", "sync_dir", "served_model", "check", "stream", "sync_tolerance"}
SERVER_OPTIONS = {"vllm": {"pause_mode"}, "sglang": {"incremental"}}


def make_engine(kind: str, model_spec: str, *, device: str = "cpu", **kw: Any) -> Engine:
    """An engine of `kind` ("hf" | "scripted" | "vllm" | "sglang") on the model `model_spec`
    ("tiny", "tiny-qwen3", "tiny-llama3", "tiny-vl" or an HF model directory).

    Local engines take `dtype`, `threads` (torch intra-op threads, process-wide), hf only
    `max_batch` (most requests per batch) and, scripted only, `workers` (forward passes at once). Server engines take `url` (required: one URL, a
    comma-separated list or a list; a rollout's calls stay on one server), `timeout` (seconds per
    request), `api_key`, `sync_dir` (a folder the servers can read, for `update_weights` with a
    state dict), `sync_tolerance` (the largest probe logprob difference accepted after a weight sync,
    default $ROWGROVE_SYNC_TOLERANCE or 1e-3; see rowgrove.engines.verify), `served_model` (the model name the server was started with; default: the one it serves), `stream` (read the
    server's answer as a stream: default False for vllm, one body per answer, True for sglang), `check` (default True: refuse a server that does
    not serve this model folder's tokenizer), and per server: `pause_mode` (vllm: "keep" | "wait"
    | "abort", how a weight update pauses generation) and `incremental` (sglang: the server's
    streaming form, None = read it from /server_info)."""
    if kind in ("vllm", "sglang"):
        return _remote_engine(kind, model_spec, device=device, **kw)
    from rowgrove.model.load import load_model

    allowed = {"hf": {"threads", "max_batch"}, "scripted": {"threads", "workers", "policy"}}
    if kind not in allowed:
        raise InputError(f"unknown engine {kind!r}: use hf, scripted, vllm or sglang")
    unknown = sorted(set(kw) - allowed[kind] - {"dtype"})
    if unknown:
        raise InputError(f"{kind} engine does not take {', '.join(unknown)}: it takes dtype, {', '.join(sorted(allowed[kind]))}")
    model, tokenizer = load_model(model_spec, device=device, dtype=kw.pop("dtype", None))
    if kind == "scripted":
        from rowgrove.engines.scripted import ScriptedEngine

        return ScriptedEngine(model, tokenizer, **kw)
    from rowgrove.engines.hf import HFEngine

    return HFEngine(model, tokenizer, **kw)


def _remote_engine(kind: str, model_spec: str, *, device: str, **kw: Any) -> Engine:
    allowed = REMOTE_OPTIONS | SERVER_OPTIONS[kind]
    unknown = sorted(set(kw) - allowed)
    if unknown:
        raise InputError(f"{kind} engine does not take {', '.join(unknown)}: it takes {', '.join(sorted(allowed))}")
    if kw.get("url") is None:
        raise InputError(f"the {kind} engine needs url=, the address of the server (--engine-url)")
    check = kw.pop("check", True)
    if kind == "vllm":
        from rowgrove.engines.vllm import VLLMEngine as cls
    else:
        from rowgrove.engines.sglang import SGLangEngine as cls
    engine = cls(model_spec, kw.pop("url"), **kw)
    if check:
        engine.check()
    return engine
