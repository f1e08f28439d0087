"""The scripted engine, for deterministic tests and demos: it "samples" a known text and reports
the loaded model's real teacher-forced logprobs for it, so everything downstream (ledger, rows,
the trainer's ratio) sees genuine numbers while the conversation stays predictable.

Images: `hints["images"]` (`rowgrove.media.Image`, in prompt order) reach a vision model's tower
(`pixel_values`, `image_grid_thw` from its processor) in the same forward pass.

Reply text: `hints["script"]` when given (any text in the family's native format: a tool call,
thinking, harmony channels), else `reply {k}` with k = `hints["ordinal"]` (the call's 1-based
ordinal in its rollout). Tokens: the tokenizer's encoding of that text (no special tokens added),
followed by the end-of-turn id unless the text already ends with a stop token (gpt-oss
`<|call|>`, GLM `<|observation|>`); the engine stops at the first stop token, as a sampler would. max_tokens, stop
strings and stop ids cut it exactly as a sampler would (a cut by max_tokens has no end-of-turn).
Model work runs in a few worker threads (`workers`), never on the event loop: one forward pass per
call. Cancelling a call (a client gone, the gateway's engine timeout) drops its pass if it has not
started; a pass already running cannot be interrupted (torch), finishes in its worker and is
thrown away, while the next calls run in the other workers instead of queueing behind it.

Weights: `update_weights(state_dict)` loads into the model between forward passes (it waits for
the running ones; new ones wait for it) and bumps `weights_version`; every token of a generation
carries the version its logprobs were computed under (`Generation.weight_versions`), as with the
hf engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from rowgrove.engines.base import Generation, SamplingParams, StopChecker, check_prompt, teacher_forced_logprobs
from rowgrove.errors import EngineError, InputError
from rowgrove.model.load import end_of_turn_id, stop_token_ids

if TYPE_CHECKING:
    import torch


# the harness policy scores its replies on the prompt's last tokens only: a coding-agent CLI's prompt
# is 16k-50k tokens on the tiny vocabulary, and a full teacher-forced pass over 47k tokens takes
# 12-16 s on one CPU thread (attention is quadratic), which put Claude Code's default-tools runs past
# their timeout; over the last 4,096 tokens it takes well under a second
HARNESS_SCORE_WINDOW = 4096


class ScriptedEngine:
    """Engine whose replies are scripted; logprobs are the model's teacher-forced ones (with the
    harness policy: teacher-forced on the prompt's last HARNESS_SCORE_WINDOW tokens).

    `threads`: if set, `torch.set_num_threads(threads)` is called once in each worker thread (note:
    torch's intra-op pool is process-wide, so this affects the whole process). `workers`: forward
    passes that may run at once (>= 1; a pass that outlives its call holds one until it ends).
    """

    def __init__(self, model: Any, tokenizer: Any, *, threads: int | None = None, workers: int = 4,
                 policy: str | None = None):
        if policy not in (None, "harness"):
            raise InputError(f"unknown script policy {policy!r}: use harness")
        if workers < 1:
            raise InputError(f"workers must be >= 1, got {workers}")
        self.model = model
        self.tokenizer = tokenizer
        self.eot_id = end_of_turn_id(tokenizer)
        self.stop_ids = frozenset(stop_token_ids(tokenizer))
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rowgrove-scripted",
                                        initializer=_set_threads, initargs=(threads,))
        # forward passes share the model; a weight update waits for them and new ones wait for it
        self._gate = threading.Condition()
        self._passes = 0
        self._updating = 0
        self._closed = False
        self.weights_version = 0
        from rowgrove.model.vision import vision_of

        self.vision = vision_of(tokenizer)  # a vision model: images in hints["images"] reach its tower
        self.policy = policy  # "harness": the reply is chosen from the decoded prompt (engines/harness_policy.py)

    def script_ids(self, sampling: SamplingParams, hints: Mapping[str, Any] | None) -> tuple[list[int], str]:
        """The token ids the engine will return for these hints and their finish reason."""
        hints = hints or {}
        if hints.get("script") is not None:
            text = str(hints["script"])
        elif hints.get("ordinal") is not None:
            text = f"reply {int(hints['ordinal'])}"
        else:
            raise InputError("scripted engine needs hints['ordinal'] (the call's 1-based ordinal) or hints['script']")
        full = list(self.tokenizer.encode(text, add_special_tokens=False))
        if not full or full[-1] not in self.stop_ids:
            full.append(self.eot_id)
        stops = set(sampling.stop_token_ids) | self.stop_ids
        checker = StopChecker(self.tokenizer, sampling.stop)
        out: list[int] = []
        for tid in full:
            if len(out) == sampling.max_tokens:
                return out, "length"
            out.append(tid)
            if tid in stops or checker.hit(out):
                return out, "stop"
        return out, "stop"

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        """The scripted reply for `hints` with teacher-forced logprobs given `prompt_ids`."""
        if self._closed:
            raise EngineError("scripted engine is closed: create a new one")
        prompt = check_prompt(prompt_ids, self.vocab_size)
        if self.policy == "harness" and (hints or {}).get("script") is None:
            from rowgrove.engines.harness_policy import reply

            hints = {**(hints or {}), "script": reply(self.tokenizer.decode(list(prompt_ids)))}
        if self.policy == "harness":
            prompt = prompt[-HARNESS_SCORE_WINDOW:]
        ids, finish = self.script_ids(sampling, hints)
        images = (hints or {}).get("images") or ()
        if images and self.vision is None:
            raise InputError("this model takes no images: serve a vision model (e.g. --model tiny-vl)")
        loop = asyncio.get_running_loop()
        try:
            extra = (images,) if images else ()  # a text request's pass is called as before
            lp, tops, version = await loop.run_in_executor(self._pool, self._score, prompt, ids, sampling.top_logprobs,
                                                           *extra)
        except Exception as e:  # a model failure is the engine's, not the caller's
            raise EngineError(f"scripted engine forward pass failed: {type(e).__name__}: {e}") from e
        return Generation(token_ids=ids, logprobs=lp, finish_reason=finish, top_logprobs=tops,
                          weight_versions=[version] * len(ids))

    def _score(self, prompt: list[int], ids: list[int], top_logprobs: int,
               images: Sequence[Any] = ()) -> tuple[list[float], Any, int]:
        """Teacher-forced logprobs and the weight version they were computed under (a worker
        thread; no update runs during the pass, so the version cannot change under it)."""
        with self._gate:
            while self._updating:
                self._gate.wait()
            self._passes += 1
            version = self.weights_version
        try:
            pixels = self.vision.pixel_inputs(images) if images and self.vision is not None else None
            lp, tops = teacher_forced_logprobs(self.model, prompt, ids, top_logprobs, vision_inputs=pixels)
        finally:
            with self._gate:
                self._passes -= 1
                self._gate.notify_all()
        return lp, tops, version

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load `state_dict` (names as in `model.state_dict()`, a subset allowed) into the model
        between two forward passes and bump `weights_version`; blocks until applied. Call it from
        a thread (e.g. `asyncio.to_thread`) when an event loop in this thread serves requests."""
        known = set(self.model.state_dict())
        unknown = [k for k in state_dict if k not in known]
        if unknown:
            raise InputError(f"update_weights: {len(unknown)} names not in the model ({', '.join(unknown[:5])}): "
                             "pass names from model.state_dict()")
        if self._closed:
            raise EngineError("scripted engine is closed: create a new one")
        try:
            self._apply(state_dict)
        except Exception as e:  # noqa: BLE001 - a failed copy is the engine's
            raise EngineError(f"update_weights failed: {type(e).__name__}: {e}") from e

    def _apply(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        import torch

        with self._gate:
            self._updating += 1
            while self._passes:
                self._gate.wait()
        try:
            with torch.no_grad():
                params = self.model.state_dict()
                for name, value in state_dict.items():
                    params[name].copy_(value.to(device=params[name].device, dtype=params[name].dtype))
            self.weights_version += 1
        finally:
            with self._gate:
                self._updating -= 1
                self._gate.notify_all()

    async def aclose(self) -> None:
        """Stop the worker threads (waits for the passes in progress)."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
