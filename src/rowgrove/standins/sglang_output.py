"""Running an SGLang /generate request: sampling it segment by segment in its own task, and its
output objects [OP, LP] (the non-streamed body, or each SSE chunk in the cumulative or
incremental form) with finish reasons [SB], text trimmed at the stop [DT] and weight-version
spans [WV, WVT]; the responses that cut the connection for the "cut" fault. Short names are the
sources listed in `rowgrove.standins.sglang`'s docstring; `GenerateOutput` is one part of the
stand-in there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from rowgrove.standins.common import sample_segments
from rowgrove.standins.sglang_request import GenerateRun

OUTPUTS_KEPT = 2000


class CutConnection(Exception):
    """Raised inside a response to drop the connection before the response is complete."""


class CutStream(StreamingResponse):
    """A StreamingResponse whose body may stop with CutConnection: the app then returns with the response
    incomplete and uvicorn closes the connection (the client sees the body end too early)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException as e:
            if isinstance(e, CutConnection) or (
                    isinstance(e, BaseExceptionGroup) and e.subgroup(CutConnection) is not None):
                return
            raise


class CutBody(Response):
    """A JSON body sent half-way, then the connection is dropped (the "cut" fault)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True})


class GenerateOutput:
    """Sampling and output, for the stand-in (which holds `engine`, `state`, `tokenizer`, `runs`,
    `outputs`, `names`, `version`, `incremental`, `segment`, `segment_delay`, `unpaused`)."""

    def _start(self, run: GenerateRun) -> None:
        self.runs[run.rid] = run
        run.task = asyncio.get_running_loop().create_task(self._produce(run))
        self.state.running[run.rid] = run.task
        self._record(run)

    async def _produce(self, run: GenerateRun) -> None:
        """Sample the request segment by segment, waking the response after each segment."""
        try:
            await self.unpaused.wait()  # a paused server holds new requests [spec §5]
            if run.fault == "slow":
                await asyncio.sleep(self.state.delay)
            elif run.fault == "hang":
                await asyncio.Future()
            if run.logprob_start >= 0:
                # prompt logprobs, teacher-forced; the first position has none [LP]
                from rowgrove.engines.base import teacher_forced_logprobs

                lps, _ = await asyncio.to_thread(teacher_forced_logprobs, self.engine.model, run.prompt[:1],
                                                 run.prompt[1:])
                full = [[None, run.prompt[0], None]] + [[lp, t, None] for lp, t in zip(lps, run.prompt[1:], strict=True)]
                run.input_triples = full[run.logprob_start:]
            stops = frozenset(run.sampling.stop_token_ids)
            segments = sample_segments(self.engine, run.prompt, run.sampling, segment=self.segment, stop_ids=stops,
                                       hints={"images": run.images} if run.images else None)
            async with contextlib.aclosing(segments):
                async for seg in segments:
                    name = self.names.get(seg.version, self.version)
                    ids = list(seg.token_ids)
                    if run.fault == "bad_id" and not run.ids:
                        ids[0] = self.vocab_size + 7
                    run.ids += ids
                    run.lps += seg.logprobs
                    if seg.tops is not None:
                        run.tops += seg.tops
                    run.names += [name] * len(ids)
                    if run.fault == "abort":
                        run.finish = finish_abort("Aborted", None)
                    elif seg.finish_reason is not None:
                        run.finish = self._finish(run, seg.finish_reason)
                    self._record(run)
                    run.events.put_nowait(len(run.ids))
                    if run.finish is not None:
                        return
                    if self.segment_delay:
                        await asyncio.sleep(self.segment_delay)
                    await self.unpaused.wait()
        except asyncio.CancelledError:  # /abort_request, pause(abort) or the client left
            run.finish = finish_abort(run.abort_message, None)
        except Exception as e:  # noqa: BLE001 - the engine's failure reaches the client as SGLang's would
            run.error = f"{type(e).__name__}: {e}"
        finally:
            self._record(run)
            self.state.running.pop(run.rid, None)
            self.runs.pop(run.rid, None)
            run.events.put_nowait(None)

    def _finish(self, run: GenerateRun, reason: str) -> dict[str, Any]:
        """`BaseFinishReason.to_json()` [SB]: stop on an id → matched id; on a string → matched
        string; max_new_tokens → {"type": "length", "length": N}."""
        if reason == "length":
            return {"type": "length", "length": run.sampling.max_tokens}
        last = run.ids[-1]
        if last in run.sampling.stop_token_ids or last in getattr(self.engine, "stop_ids", ()):
            return {"type": "stop", "matched": last}
        tail = self._decode(run.ids[-16:], False)
        hit = [s for s in run.sampling.stop if s in tail]
        return {"type": "stop", "matched": hit[0] if hit else last}

    async def _wait(self, run: GenerateRun, request: Request) -> bool:
        """Wait for a non-streamed request to end; True if the client left first (then the
        request is aborted, as SGLang's `_wait_one_response` does [RE])."""
        assert run.task is not None
        while not run.task.done():
            await asyncio.wait({run.task}, timeout=0.05)
            if not run.task.done() and await request.is_disconnected():
                self._client_left(run)
                return True
        return False

    def _client_left(self, run: GenerateRun) -> None:
        self.state.disconnected.append(run.rid)
        run.abort_message = "Request is disconnected from the client side."
        if run.task is not None:
            run.task.cancel()

    async def _events(self, run: GenerateRun, request: Request, started: bool = True):
        """The SSE body: `data: {...}\\n\\n` per chunk, then `data: [DONE]\\n\\n` [HS-new]. In the
        cumulative form each chunk holds everything so far; in the incremental form only the
        new ids/text/logprobs [OP, LP `slice_streaming_output_meta_info`]. Queued wake-ups
        coalesce into one chunk [RE `_coalesce_streaming_chunks`]."""
        sent = 0
        try:
            while started:
                item = await run.events.get()
                ended = item is None
                while not run.events.empty():
                    ended = ended or run.events.get_nowait() is None
                if run.error is not None:
                    yield b"data: " + sglang_dumps({"error": {"message": run.error}}) + b"\n\n"
                    break
                n = len(run.ids)
                final = run.finish is not None
                if run.fault == "cut" and (n > 0 or final):
                    if n:
                        yield b"data: " + sglang_dumps(self._output(run, 0, n, final=False)) + b"\n\n"
                    raise CutConnection
                if n > sent or final:
                    yield b"data: " + sglang_dumps(self._output(run, sent, n, final=final)) + b"\n\n"
                    sent = n
                if final or ended:
                    break
            if not started:  # turned away before it ran: one abort chunk
                yield b"data: " + sglang_dumps(self._output(run, 0, 0, final=True)) + b"\n\n"
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:  # the client disconnected (Starlette cancels the body)
            if run.finish is None:
                self._client_left(run)
            raise

    def _output(self, run: GenerateRun, start: int, end: int, *, final: bool) -> dict[str, Any]:
        """One output object [OP]: `text`, `output_ids` and `meta_info`. Cumulative: everything
        up to `end`; incremental: the part from `start` [LP]. The final one adds the finish
        reason, `e2e_latency` and the `weight_versions` spans [WV, WVT test_11]."""
        lo = start if self.incremental else 0
        ids = run.ids[lo:end]
        triples = [[run.lps[i], run.ids[i], self._decode([run.ids[i]], False) if run.return_text else None]
                   for i in range(lo, end)]
        if run.fault == "short_logprobs" and lo == 0 and triples:
            triples = triples[1:]  # one logprob fewer than ids
        sp = run.params.get("skip_special_tokens")
        skip = True if sp is None else bool(sp)
        text = self._text(run, end, skip, final)
        if self.incremental:
            text = text[len(self._text(run, start, skip, False)):] if start else text
        meta: dict[str, Any] = {
            "id": run.rid,
            "finish_reason": run.finish if final else None,
            "prompt_tokens": len(run.prompt),
            "weight_version": run.names[end - 1] if end else self.version,
            "completion_tokens": end,
            "cached_tokens": 0,
            # logprob_start_len -1: the last prompt position only, which has no logprob (spec §2.3, unconfirmed)
            "input_token_logprobs": (run.input_triples if run.input_triples is not None
                                     else [[None, run.prompt[-1], None]]),
            "output_token_logprobs": triples,
        }
        if run.top_n:
            meta["input_top_logprobs"] = [None]
            meta["output_top_logprobs"] = [[[lp, tid, None] for tid, lp in run.tops[i]] if i < len(run.tops) else None
                                           for i in range(lo, end)]
        if final:
            spans = _spans(run.names[:end], self.version)
            meta["weight_versions"] = spans
            meta["weight_version"] = spans[-1]["version"]  # [WV `add_weight_versions_to_meta_info`]
            meta["e2e_latency"] = time.monotonic() - run.started
            self._record(run, spans)
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _text(self, run: GenerateRun, end: int, skip: bool, final: bool) -> str:
        """The output text of the first `end` ids; on the final output, trimmed at the matched
        stop unless no_stop_trim [DT `trim_matched_stop`]."""
        ids = run.ids[:end]
        if final and run.finish and run.finish.get("type") == "stop" and not run.params.get("no_stop_trim"):
            matched = run.finish.get("matched")
            if isinstance(matched, int):
                return self._decode(ids[:-1], skip)
            text = self._decode(ids, skip)
            pos = text.find(matched) if isinstance(matched, str) else -1
            return text[:pos] if pos >= 0 else text
        return self._decode(ids, skip)

    def _decode(self, ids: list[int], skip: bool) -> str:
        return self.tokenizer.decode([i for i in ids if 0 <= i < len(self.tokenizer)], skip_special_tokens=skip)

    def _record(self, run: GenerateRun, spans: list[dict[str, Any]] | None = None) -> None:
        """What the stand-in sampled for `run` and how it ended, for tests: `outputs[rid]` (ids as
        sent: a bad_id fault's id shows; logprob and stream faults do not)."""
        entry = self.outputs.get(run.rid)
        if entry is None:
            entry = self.outputs[run.rid] = {"input_ids": run.prompt}
            while len(self.outputs) > OUTPUTS_KEPT:
                self.outputs.popitem(last=False)
        entry.update(output_ids=list(run.ids), logprobs=list(run.lps), versions=list(run.names),
                     finish_reason=run.finish, error=run.error)
        if spans is not None:
            entry["weight_versions"] = spans


def finish_abort(message: str, status: int | None) -> dict[str, Any]:
    """FINISH_ABORT.to_json() [SB]."""
    return {"type": "abort", "message": message, "status_code": status, "err_type": None}


def _spans(names: list[str], current: str) -> list[dict[str, Any]]:
    """Per-token version names → contiguous spans from 0 [WV]; none sampled → one empty span
    [WVT test_10]."""
    spans: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        if spans and spans[-1]["version"] == name:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"version": name, "start": i, "end": i + 1})
    return spans or [{"version": current, "start": 0, "end": 0}]


def sglang_dumps(obj: Any) -> bytes:
    """orjson as SGLang writes it: NaN and ±inf become null [HS-new ORJSONResponse]."""
    import orjson

    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


async def error_events(message: str):
    yield b"data: " + sglang_dumps({"error": {"message": message}}) + b"\n\n"
    yield b"data: [DONE]\n\n"
