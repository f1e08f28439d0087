"""An engine over verl's own inference servers: the `server_manager` verl hands every agent loop
(`verl.workers.rollout.llm_server.LLMServerClient`, verl 0.9.1), so the gateway samples from the
servers verl's checkpoint engine updates after every step.

    engine = VerlServerEngine(server_manager, tokenizer)       # inside an AgentLoopWorker
    gen = await engine.generate(prompt_ids, SamplingParams(max_tokens=64), hints={"rollout_id": rid})

One call is one `await server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`:
token ids in, a `TokenOutput` (token_ids, log_probs, stop_reason, extra_fields) out. Its
`extra_fields["global_steps"]` (the step of the weights the server holds, set by verl's
`update_weights(global_steps)`) becomes every sampled token's weight version; a server that reports
none leaves the version to `weights_version` (the agent-loop worker sets it to the batch's
`global_steps`). `request_id` is the rollout id, so verl's load balancer keeps a rollout's calls on
one server (sticky sessions, prefix cache).

verl's servers answer only the sampled token's logprob (no alternatives: `top_logprobs > 0` is
refused) and fold "stop" and "length" into `stop_reason="completed"`: a generation that filled
`max_tokens` without ending on a stop id is reported as "length". `stop_reason="aborted"` (a weight
sync paused the server) is an EngineError: the gateway masks the call, never trains it.

The manager is always awaited on the event loop that owns it (the worker's): the gateway may run
on its own thread and loop, and Ray's handles and verl's client state belong to the worker's loop.
This module imports nothing from verl.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from rowgrove.engines.base import Generation, SamplingParams, check_prompt
from rowgrove.errors import EngineError, InputError
from rowgrove.model.turns import stop_token_ids


class VerlServerEngine:
    """`Engine` over an `LLMServerClient`-shaped `server_manager` (anything with
    `async generate(request_id, *, prompt_ids, sampling_params)` returning an object with
    `token_ids`, `log_probs`, `stop_reason` and `extra_fields`).

    `tokenizer`: the model's (verl's `HFModelConfig.tokenizer`); the gateway renders with it.
    `loop`: the event loop that owns `server_manager` (default: the running loop at construction).
    `weights_version`: the version stamped on tokens when the server reports no `global_steps`.
    `calls` counts the generate calls made (a test and a log can tell who sampled)."""

    def __init__(self, server_manager: Any, tokenizer: Any, *, loop: asyncio.AbstractEventLoop | None = None,
                 weights_version: int = 0):
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.stop_ids = tuple(stop_token_ids(tokenizer))
        self.vocab_size = len(tokenizer)
        self.weights_version = int(weights_version)
        self.calls = 0
        try:
            self.loop = loop or asyncio.get_running_loop()
        except RuntimeError:
            raise InputError("VerlServerEngine needs the event loop that owns server_manager: build it inside "
                             "the agent loop's coroutine, or pass loop=") from None

    def sampling_params(self, sampling: SamplingParams) -> dict[str, Any]:
        """verl's `sampling_params` for one call (vLLM's SamplingParams keys, which verl's server
        forwards): the logprob of each sampled token (as the server computes it), the model's stop ids plus
        the request's, special tokens kept in the text (the ids are the truth either way)."""
        if sampling.top_logprobs:
            raise InputError(f"top_logprobs={sampling.top_logprobs}: verl's servers return only the sampled "
                             "token's logprob; ask for top_logprobs=0")
        params: dict[str, Any] = {
            "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": -1,
            "repetition_penalty": 1.0, "max_tokens": sampling.max_tokens, "logprobs": True,
            "stop_token_ids": sorted(set(self.stop_ids) | set(sampling.stop_token_ids)),
            "skip_special_tokens": False,
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
            params["include_stop_str_in_output"] = True
        if sampling.seed is not None:
            params["seed"] = sampling.seed
        return params

    async def _call(self, request_id: str, prompt: list[int], params: dict[str, Any]) -> Any:
        self.calls += 1
        return await self.server_manager.generate(request_id, prompt_ids=prompt, sampling_params=params)

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        """Sample through verl's server manager; see the module docstring for the mapping."""
        prompt = check_prompt(prompt_ids, self.vocab_size)
        params = self.sampling_params(sampling)
        request_id = str((hints or {}).get("rollout_id") or uuid.uuid4().hex)
        coro = self._call(request_id, prompt, params)
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is self.loop:
            out = await coro
        else:
            fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
            try:
                out = await asyncio.wrap_future(fut)
            except asyncio.CancelledError:
                fut.cancel()
                raise
        return self.to_generation(out, sampling)

    def to_generation(self, out: Any, sampling: SamplingParams) -> Generation:
        """A verl `TokenOutput` as a `Generation` (EngineError when it is not one the gateway may store)."""
        if out.stop_reason == "aborted":
            raise EngineError("verl's server aborted the request (a weight sync paused it): retry the call")
        ids = [int(t) for t in out.token_ids]
        if out.log_probs is None:
            raise EngineError("verl's server returned no logprobs although the call asked for them "
                              "(sampling_params logprobs=True): is the server built without logprobs support?")
        lps = [float(x) for x in out.log_probs]
        ended = bool(ids) and ids[-1] in set(self.stop_ids) | set(sampling.stop_token_ids)
        finish = "length" if len(ids) >= sampling.max_tokens and not ended else "stop"
        steps = (out.extra_fields or {}).get("global_steps")
        version = self.weights_version if steps is None or int(steps) < 0 else int(steps)
        return Generation(token_ids=ids, logprobs=lps, finish_reason=finish, weight_versions=[version] * len(ids))

    async def aclose(self) -> None:
        """Nothing to close: the server manager belongs to verl."""


__all__ = ["VerlServerEngine"]
