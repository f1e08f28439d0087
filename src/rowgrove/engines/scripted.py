"""The scripted engine, for deterministic tests and demos: it "samples" a known text and reports
the loaded model's real teacher-forced logprobs for it, so everything downstream (ledger, rows,
the trainer's ratio) sees genuine numbers while the conversation stays predictable.

Reply text: `hints["script"]` when given (any text in the family's native format: a tool call,
thinking, harmony channels), else `reply {k}` with k = `hints["ordinal"]` (the call's 1-based
ordinal in its rollout). Tokens: the tokenizer's encoding of that text (no special tokens added),
followed by the end-of-turn id unless the text already ends with a stop token (gpt-oss
`<|call|>`, GLM `<|observation|>`); the engine stops at the first stop token, as a sampler would. max_tokens, stop
strings and stop ids cut it exactly as a sampler would (a cut by max_tokens has no end-of-turn).
Model work runs in one worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rowgrove.engines.base import Generation, SamplingParams, StopChecker, check_prompt, teacher_forced_logprobs
from rowgrove.errors import EngineError, InputError
from rowgrove.model.load import end_of_turn_id, stop_token_ids


class ScriptedEngine:
    """Engine whose replies are scripted; logprobs are the model's teacher-forced ones.

    `threads`: if set, `torch.set_num_threads(threads)` is called once in the worker thread (note:
    torch's intra-op pool is process-wide, so this affects the whole process).
    """

    def __init__(self, model: Any, tokenizer: Any, *, threads: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.eot_id = end_of_turn_id(tokenizer)
        self.stop_ids = frozenset(stop_token_ids(tokenizer))
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rowgrove-scripted",
                                        initializer=_set_threads, initargs=(threads,))
        self._closed = False

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
        ids, finish = self.script_ids(sampling, hints)
        loop = asyncio.get_running_loop()
        try:
            lp, tops = await loop.run_in_executor(
                self._pool, teacher_forced_logprobs, self.model, prompt, ids, sampling.top_logprobs)
        except Exception as e:  # a model failure is the engine's, not the caller's
            raise EngineError(f"scripted engine forward pass failed: {type(e).__name__}: {e}") from e
        return Generation(token_ids=ids, logprobs=lp, finish_reason=finish, top_logprobs=tops)

    async def aclose(self) -> None:
        """Stop the worker thread (waits for the request in progress)."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)


def _set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)
