"""Inference engines behind one protocol (`rowgrove.engines.base.Engine`): prompt token ids in,
sampled token ids + their logprobs + a finish reason out.

    make_engine("scripted", "tiny")   deterministic replies, real teacher-forced logprobs (tests, demos)
    make_engine("hf", "tiny" | PATH)  local transformers generation, concurrent requests batched

Adding vLLM or SGLang later: both servers expose a token-level endpoint (vLLM's `/generate` style
APIs and `prompt_token_ids` on completions, SGLang's `/generate` with `input_ids`) that takes the
prompt as token ids and returns output token ids with their logprobs. An adapter is a class with
`tokenizer` (loaded with `rowgrove.model.load.load_tokenizer` from the same model) and an async
`generate(prompt_ids, sampling, hints=None)` that posts `input_ids` plus the mapped sampling params
(temperature, top_p, max_new_tokens, stop, stop_token_ids, seed, logprobs) and returns
`Generation(token_ids, logprobs, finish_reason)` from the output ids (never from re-encoded text),
raising EngineError on HTTP failures. Ask for the logprobs of the raw distribution (vLLM: start
the server with `--logprobs-mode raw_logprobs`) so they mean what `Generation` promises.
"""

from __future__ import annotations

from typing import Any

from rowgrove.engines.base import Engine, Generation, SamplingParams
from rowgrove.errors import InputError

__all__ = ["Engine", "Generation", "SamplingParams", "make_engine"]


def make_engine(kind: str, model_spec: str, *, device: str = "cpu", **kw: Any) -> Engine:
    """An engine of `kind` ("hf" | "scripted") on the model `model_spec` ("tiny", "tiny-qwen3",
    "tiny-llama3" or an HF model directory). Keyword options: `dtype` (both), `threads` (both:
    torch intra-op threads, process-wide), `max_batch` (hf: most requests per batch)."""
    from rowgrove.model.load import load_model

    allowed = {"hf": {"threads", "max_batch"}, "scripted": {"threads"}}
    if kind not in allowed:
        raise InputError(f"unknown engine {kind!r}: use hf or scripted")
    unknown = sorted(set(kw) - allowed[kind] - {"dtype"})
    if unknown:
        raise InputError(f"{kind} engine does not take {', '.join(unknown)}: it takes dtype, {', '.join(sorted(allowed[kind]))}")
    model, tokenizer = load_model(model_spec, device=device, dtype=kw.pop("dtype", None))
    if kind == "scripted":
        from rowgrove.engines.scripted import ScriptedEngine

        return ScriptedEngine(model, tokenizer, **kw)
    from rowgrove.engines.hf import HFEngine

    return HFEngine(model, tokenizer, **kw)
