"""A stand-in for an SGLang server: SGLang's native HTTP API, sampling real tokens with an hf engine.

    with start_standin("sglang", "tiny", incremental=True) as server:
        engine = make_engine("sglang", "tiny", url=server.url)

Every shape follows the SGLang source it cites (sgl-project/sglang at the commits named; "HS" is
python/sglang/srt/entrypoints/http_server.py). Short names used below:

    HS-new  http_server.py                                  @ 0025436eab0556737d615b36a4dd3e1e26e82f3d
    HS-old  http_server.py                                  @ 9c0549b727fe222444495cea6b369697534d60f0
    IO      python/sglang/srt/managers/io_struct.py         @ 001067fffe33427bee0ed2f007fb7551a1d76b44
    SP      python/sglang/srt/sampling/sampling_params.py   @ 00c17cafcb9e289d5ca97c50e44ada54e4fd5b03
    OP      .../managers/tokenizer_manager_components/output_processor.py (newest stored version)
    LP      .../managers/tokenizer_manager_components/logprob_ops.py      @ 229224a3f4058cdc3b6fe8774b97d96950cda1ee
    RE      .../managers/tokenizer_manager_components/response_emitter.py @ 5bf23cf6bf992f5b2f35b9e92cc1fb3f3422ff49
    WV      python/sglang/srt/utils/weight_versions.py      @ 19f93835d3f8a0b84485592090245d11de783289
    WVT     test/registered/rl/test_weight_version_spans.py @ 71219d32d47ee934fc41c278f8667ad5d9d9c983
    DOC     docs/docs/basic_usage/native_api.mdx            @ 263f1b8612c2d9ac47ff47ca0e895efe4d7726ff
    SB, DT  python/sglang/srt/managers/schedule_batch.py, detokenizer_manager.py (commit not recorded)

What it does like SGLang: `/generate` on `input_ids` (or `text`), non-streaming or SSE in the
cumulative (default) or incremental (`incremental=True`, SGLang's --incremental-streaming-output)
form; `output_ids` include the stop token; logprob triples; finish reason objects; the weight
version per chunk and the final `weight_versions` spans (a weight update that lands between two
segments of a request splits its spans, and the tokens after it really come from the new weights:
the hf engine applies an update only while no row runs); `/abort_request` and abort on client
disconnect; the weight routes; the two error body shapes. Where it differs: it samples `segment`
tokens at a time (a stream chunk per segment), it refuses sampling options it cannot honour
(top_k, min_p, penalties, grammars, ignore_eos, n > 1, batches) with a 400, and `max_queued`
counts every unfinished request (SGLang's --max-queued-requests counts the waiting ones).

Besides SGLang's routes: `GET /_standin/log` (common's log plus `outputs`, what each request was
sampled and sent, by rid, and `weight_version`, the current name) and `POST /_standin/fault`
(see `rowgrove.standins.common`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from rowgrove.engines.base import SamplingParams
from rowgrove.errors import InputError
from rowgrove.standins.common import StandinState, json_response, sample_segments

# SamplingParams' fields [SP]: any other key makes SGLang fail building the struct (a TypeError,
# not a ValueError, so a bare 500; inferred in the spec, §1).
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "stop_regex",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "min_new_tokens",
    "n", "frequency_penalty", "presence_penalty", "repetition_penalty", "json_schema", "regex", "ebnf",
    "structural_tag", "logit_bias", "custom_params", "stream_interval", "sampling_seed",
})
# options the stand-in cannot honour: each must be absent or hold its neutral value
NEUTRAL = {"top_k": (-1, None), "min_p": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
           "presence_penalty": (0, 0.0, None), "repetition_penalty": (1, 1.0, None),
           "min_new_tokens": (0, None), "n": (1, None), "ignore_eos": (False, None), "stop_regex": (None, [], ""),
           "json_schema": (None,), "regex": (None,), "ebnf": (None,), "structural_tag": (None,),
           "logit_bias": (None, {}), "custom_params": (None,)}
FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
              "requests, the operation will not be performed.)\n")
QUEUE_FULL = "The request queue is full."
_OUTPUTS_KEPT = 2000


class _Cut(Exception):
    """Raised inside a response to drop the connection before the response is complete."""


class _CutStream(StreamingResponse):
    """A StreamingResponse whose body may stop with _Cut: the app then returns with the response
    incomplete and uvicorn closes the connection (the client sees the body end too early)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException as e:
            if isinstance(e, _Cut) or (isinstance(e, BaseExceptionGroup) and e.subgroup(_Cut) is not None):
                return
            raise


class _CutBody(Response):
    """A JSON body sent half-way, then the connection is dropped (the "cut" fault)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body[: len(self.body) // 2], "more_body": True})


def _error(message: str, status: int = 400) -> Response:
    """SGLang's native error: 400 {"error": {"message"}} (`_create_error_response`) [HS-old, HS-new]."""
    return json_response({"error": {"message": message}}, status)


def _http_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """FastAPI's HTTPException handler in SGLang: the OpenAI-style ErrorResponse [HS-new]."""
    return json_response({"object": "error", "message": message, "type": str(status), "param": None,
                          "code": status}, status, headers)


def _bad_request(message: str) -> Response:
    """A request-validation error (422 remapped to 400) [HS-new]."""
    return json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                          "code": 400}, 400)


@dataclass(eq=False)
class _Run:
    """One /generate request: what has been sampled so far, and how it ended."""

    rid: str
    prompt: list[int]
    sampling: SamplingParams
    params: dict[str, Any]
    top_n: int
    return_text: bool
    fault: str | None
    started: float = field(default_factory=time.monotonic)
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)   # the weight version name of each token
    finish: dict[str, Any] | None = None
    error: str | None = None
    abort_message: str = "Aborted"
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    logprob_start: int = -1                            # logprob_start_len
    images: list[Any] = field(default_factory=list)    # image_data decoded (rowgrove.media.Image), in order
    input_triples: list[list[Any]] | None = None       # prompt logprobs, when logprob_start >= 0


class _SGLangStandin:
    def __init__(self, engine: Any, model: str, state: StandinState, *, incremental: bool, segment: int,
                 max_queued: int | None, weight_version: str, segment_delay: float,
                 served_model_name: str | None):
        from rowgrove.model.load import model_dir

        if segment < 1:
            raise InputError(f"segment must be >= 1, got {segment}")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = model_dir(model)
        self.served_model_name = served_model_name or str(model)
        self.state = state
        self.incremental = incremental
        self.segment = segment
        self.max_queued = max_queued
        self.segment_delay = segment_delay
        self.vocab_size = int(getattr(engine, "vocab_size", len(self.tokenizer)))
        self.context_length = self._context_length()
        self.version = str(weight_version)
        # the hf engine counts updates; each count has the version name it was loaded under
        self.names: dict[int, str] = {int(getattr(engine, "weights_version", 0)): self.version}
        self.runs: dict[str, _Run] = {}
        self.outputs: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.unpaused = asyncio.Event()
        self.unpaused.set()
        self.weight_lock = asyncio.Lock()

    def _context_length(self) -> int:
        import json

        try:
            cfg = json.loads((self.model_path / "config.json").read_text())
            return int(cfg.get("max_position_embeddings") or 32768)
        except (OSError, ValueError, TypeError):
            return 32768

    # ---- /generate ------------------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        """POST|PUT /generate (`generate_request` [HS-new]; body `GenerateReqInput` [IO])."""
        try:
            obj = await request.json()
        except ValueError:
            return _bad_request("the body is not JSON")
        if not isinstance(obj, dict):
            return _bad_request("the body must be a JSON object (GenerateReqInput)")
        self.state.requests.append(obj)
        fault = self.state.take_fault()
        if fault in ("500", "502"):
            return _http_error(int(fault), f"stand-in fault: {fault}")
        if fault in ("429", "503"):
            return _http_error(int(fault), f"stand-in fault: {fault}", {"retry-after": "2"})
        if fault == "400":
            return _error("stand-in fault: 400")
        stream = bool(obj.get("stream", False))
        try:
            run = self._parse(obj, fault)
        except _UnknownKey:
            # SamplingParams(**params) raises TypeError: uncaught, a bare 500 (spec §5)
            return PlainTextResponse("Internal Server Error", 500)
        except ValueError as e:
            if stream:  # the ValueError surfaces inside the stream: 200, an error event, [DONE] [HS-new]
                return StreamingResponse(_error_events(str(e)), media_type="text/event-stream")
            return _error(str(e))
        if self.max_queued is not None and len(self.state.running) >= self.max_queued:
            # the scheduler aborts with status 503 [RE `_handle_abort_finish_reason`]: a 503
            # ErrorResponse when not streaming, an abort chunk under 200 when streaming
            if not stream:
                return _http_error(503, QUEUE_FULL)
            run.finish = _abort(QUEUE_FULL, 503)
            return _CutStream(self._events(run, request, started=False), media_type="text/event-stream")
        self._start(run)
        if stream:
            return _CutStream(self._events(run, request), media_type="text/event-stream")
        if await self._wait(run, request):
            return Response(status_code=200)  # nobody reads it
        if run.error is not None:
            return _error(run.error)
        body = _dumps(self._output(run, 0, len(run.ids), final=True))
        if fault == "cut":
            return _CutBody(body, media_type="application/json")
        return Response(body, media_type="application/json")

    def _parse(self, obj: dict[str, Any], fault: str | None) -> _Run:
        """The request as a _Run; ValueError (SGLang's 400) for what SGLang or the stand-in refuses."""
        text, ids = obj.get("text"), obj.get("input_ids")
        if obj.get("input_embeds") is not None:
            raise ValueError("the stand-in does not take input_embeds")
        images = obj.get("image_data")
        if images is not None and (not isinstance(images, list) or not all(isinstance(u, str) and u for u in images)):
            raise ValueError("image_data must be a list of image URLs, paths or base64 data URLs")
        decoded = []
        if images:
            from rowgrove.media import MediaError, load_url

            try:  # the stand-in reads data URLs only (SGLang also fetches URLs and reads paths)
                decoded = [load_url(u) for u in images]
            except MediaError as e:
                raise ValueError(f"image_data: {e}") from None
        if (text is None) == (ids is None):
            raise ValueError("Either text, input_ids or input_embeds should be provided.")  # [IO]
        if ids is not None:
            if not isinstance(ids, list):
                raise ValueError("input_ids must be a list of ints")
            if not ids:
                raise ValueError("input_ids cannot be empty.")  # [IO]
            if not isinstance(ids[0], int):
                raise ValueError("the stand-in does not take batch requests")
            if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"input_ids hold ids outside the vocabulary [0, {self.vocab_size})")
            prompt = list(ids)
        else:
            if not isinstance(text, str):
                raise ValueError("the stand-in does not take batch requests")
            prompt = list(self.tokenizer.encode(text))
        if len(prompt) >= self.context_length:
            raise ValueError(f"The input ({len(prompt)} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        params = obj.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ValueError("the stand-in does not take batch requests (sampling_params is a list)")
        unknown = sorted(set(params) - SAMPLING_KEYS)
        if unknown:
            raise _UnknownKey(unknown)
        for key, allowed in NEUTRAL.items():
            if key in params and params[key] not in allowed:
                raise ValueError(f"the stand-in cannot honour sampling_params.{key}={params[key]!r}")
        rid = obj.get("rid") if obj.get("rid") is not None else uuid.uuid4().hex
        if not isinstance(rid, str):
            raise ValueError("the stand-in does not take batch requests (rid is a list)")
        if rid in self.runs:
            raise ValueError(f"Duplicate request ID: {rid}")
        if obj.get("return_logprob") is not True:
            raise ValueError("the stand-in always needs return_logprob: true")
        start = obj.get("logprob_start_len", -1)
        start = -1 if start is None else start
        if not isinstance(start, int) or isinstance(start, bool) or start < -1:
            raise ValueError(f"logprob_start_len must be an integer >= -1, got {start!r}")
        top_n = obj.get("top_logprobs_num") or 0
        stop = params.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        temperature = params.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        if 0 <= temperature < 1e-6:
            temperature = 0.0  # greedy [SP]
        max_new = params.get("max_new_tokens")
        max_new = 128 if max_new is None else max_new  # [SP] default
        seed = params.get("sampling_seed")
        try:
            sampling = SamplingParams(
                temperature=temperature,
                top_p=1.0 if params.get("top_p") is None else float(params["top_p"]),
                max_tokens=int(max_new),
                stop=tuple(stop),
                stop_token_ids=tuple(int(i) for i in params.get("stop_token_ids") or ()),
                seed=None if seed is None else int(seed),
                top_logprobs=int(top_n),
            )
        except InputError as e:
            raise ValueError(str(e)) from None
        return _Run(rid=rid, prompt=prompt, sampling=sampling, params=params, top_n=int(top_n),
                    return_text=bool(obj.get("return_text_in_logprobs")), fault=fault, logprob_start=start,
                    images=decoded)

    def _start(self, run: _Run) -> None:
        self.runs[run.rid] = run
        run.task = asyncio.get_running_loop().create_task(self._produce(run))
        self.state.running[run.rid] = run.task
        self._record(run)

    async def _produce(self, run: _Run) -> None:
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
                        run.finish = _abort("Aborted", None)
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
            run.finish = _abort(run.abort_message, None)
        except Exception as e:  # noqa: BLE001 - the engine's failure reaches the client as SGLang's would
            run.error = f"{type(e).__name__}: {e}"
        finally:
            self._record(run)
            self.state.running.pop(run.rid, None)
            self.runs.pop(run.rid, None)
            run.events.put_nowait(None)

    def _finish(self, run: _Run, reason: str) -> dict[str, Any]:
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

    async def _wait(self, run: _Run, request: Request) -> bool:
        """Wait for a non-streamed request to end; True if the client left first (then the
        request is aborted, as SGLang's `_wait_one_response` does [RE])."""
        assert run.task is not None
        while not run.task.done():
            await asyncio.wait({run.task}, timeout=0.05)
            if not run.task.done() and await request.is_disconnected():
                self._client_left(run)
                return True
        return False

    def _client_left(self, run: _Run) -> None:
        self.state.disconnected.append(run.rid)
        run.abort_message = "Request is disconnected from the client side."
        if run.task is not None:
            run.task.cancel()

    async def _events(self, run: _Run, request: Request, started: bool = True):
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
                    yield b"data: " + _dumps({"error": {"message": run.error}}) + b"\n\n"
                    break
                n = len(run.ids)
                final = run.finish is not None
                if run.fault == "cut" and (n > 0 or final):
                    if n:
                        yield b"data: " + _dumps(self._output(run, 0, n, final=False)) + b"\n\n"
                    raise _Cut
                if n > sent or final:
                    yield b"data: " + _dumps(self._output(run, sent, n, final=final)) + b"\n\n"
                    sent = n
                if final or ended:
                    break
            if not started:  # turned away before it ran: one abort chunk
                yield b"data: " + _dumps(self._output(run, 0, 0, final=True)) + b"\n\n"
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:  # the client disconnected (Starlette cancels the body)
            if run.finish is None:
                self._client_left(run)
            raise

    def _output(self, run: _Run, start: int, end: int, *, final: bool) -> dict[str, Any]:
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

    def _text(self, run: _Run, end: int, skip: bool, final: bool) -> str:
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

    def _record(self, run: _Run, spans: list[dict[str, Any]] | None = None) -> None:
        """What the stand-in sampled for `run` and how it ended, for tests: `outputs[rid]` (ids as
        sent: a bad_id fault's id shows; logprob and stream faults do not)."""
        entry = self.outputs.get(run.rid)
        if entry is None:
            entry = self.outputs[run.rid] = {"input_ids": run.prompt}
            while len(self.outputs) > _OUTPUTS_KEPT:
                self.outputs.popitem(last=False)
        entry.update(output_ids=list(run.ids), logprobs=list(run.lps), versions=list(run.names),
                     finish_reason=run.finish, error=run.error)
        if spans is not None:
            entry["weight_versions"] = spans

    # ---- abort, info, tokenizer -----------------------------------------------------------

    async def abort_request(self, request: Request) -> Response:
        """POST /abort_request {"rid"} | {"abort_all": true}: 200, empty body; an unknown rid is a
        no-op [HS-new; IO `AbortReq`]. The aborted request ends with finish reason abort."""
        try:
            obj = await request.json()
        except ValueError:
            obj = {}
        if not isinstance(obj, dict):
            return _error("the body must be a JSON object (AbortReq)")
        if obj.get("abort_all"):
            for rid in list(self.runs):
                self._abort_run(rid, "Aborted by abort_all.")
        else:
            rid = obj.get("rid") or ""
            self.state.aborted.append(rid)
            if rid in self.runs:
                self._abort_run(rid, "Aborted by AbortReq.")
        return Response(status_code=200)

    def _abort_run(self, rid: str, message: str) -> None:
        """End a running request with finish reason abort (logged in `state.aborted` once)."""
        run = self.runs.get(rid)
        if run is None or run.task is None:
            return
        if rid not in self.state.aborted:
            self.state.aborted.append(rid)
        run.abort_message = message
        run.task.cancel()

    async def model_info(self, request: Request) -> Response:
        """GET /get_model_info [HS-new; key set per DOC]."""
        import json

        try:
            cfg = json.loads((self.model_path / "config.json").read_text())
        except (OSError, ValueError):
            cfg = {}
        return json_response({
            "model_path": str(self.model_path), "tokenizer_path": str(self.model_path), "is_generation": True,
            "preferred_sampling_params": None, "weight_version": self.version,
            "has_image_understanding": getattr(self.engine, "vision", None) is not None, "has_audio_understanding": False,
            "model_type": cfg.get("model_type"), "architectures": cfg.get("architectures"),
        })

    async def server_info(self, request: Request) -> Response:
        """GET /server_info (and the older /get_server_info): ServerArgs flattened plus scheduler
        info, `internal_states` and `version` [HS-new, DOC]; a subset of ServerArgs here."""
        return json_response({
            "model_path": str(self.model_path), "tokenizer_path": str(self.model_path),
            "served_model_name": self.served_model_name, "skip_tokenizer_init": False,
            "incremental_streaming_output": self.incremental, "stream_interval": 1,
            "weight_version": self.version, "context_length": self.context_length,
            "max_queued_requests": self.max_queued, "max_total_num_tokens": 1 << 20,
            "max_req_input_len": self.context_length - 1, "internal_states": [{}],
            "version": "0.0.0-rowgrove-standin",
        })

    async def tokenize(self, request: Request) -> Response:
        """POST /tokenize and /v1/tokenize: OpenAI-style, JSON only [HS-new `validate_json_request`;
        shapes per DOC]."""
        obj = await _json_body(request)
        if isinstance(obj, Response):
            return obj
        prompt = obj.get("prompt")
        add = obj.get("add_special_tokens", True)
        if isinstance(prompt, str):
            tokens = list(self.tokenizer.encode(prompt, add_special_tokens=add))
            return json_response({"tokens": tokens, "count": len(tokens), "max_model_len": self.context_length})
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            tokens = [list(self.tokenizer.encode(p, add_special_tokens=add)) for p in prompt]
            return json_response({"tokens": tokens, "count": [len(t) for t in tokens],
                                  "max_model_len": self.context_length})
        return _bad_request("prompt must be a string or a list of strings")

    async def detokenize(self, request: Request) -> Response:
        """POST /detokenize and /v1/detokenize [HS-new; DOC]."""
        obj = await _json_body(request)
        if isinstance(obj, Response):
            return obj
        tokens = obj.get("tokens")
        skip = bool(obj.get("skip_special_tokens", True))
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return json_response({"text": self._decode(tokens, skip)})
        if isinstance(tokens, list) and all(isinstance(t, list) for t in tokens):
            return json_response({"text": [self._decode(t, skip) for t in tokens]})
        return _bad_request("tokens must be a list of ints or a list of lists of ints")

    async def health(self, request: Request) -> Response:
        """GET /health and /health_generate: 200 with an empty body when healthy [HS-new]."""
        return Response(status_code=200)

    async def flush_cache(self, request: Request) -> Response:
        """GET|POST /flush_cache: text/plain, 200, or 400 while requests run [HS-new]."""
        return PlainTextResponse(FLUSH_TEXT, 400 if self.runs else 200)

    # ---- weights and control --------------------------------------------------------------

    async def update_weights_from_disk(self, request: Request) -> Response:
        """POST /update_weights_from_disk [HS-new; IO `UpdateWeightFromDiskReqInput`; DOC]: load
        FOLDER/model.safetensors into the engine; on success `weight_version` (if given) names the
        new weights. 200 {"success": true, ...} or 400 {"success": false, "message"}."""
        obj = await _json_body(request, strict=False)
        if isinstance(obj, Response):
            return obj
        path = obj.get("model_path")
        name = obj.get("weight_version")

        def failed(message: str) -> Response:
            return json_response({"success": False, "message": message, "num_paused_requests": 0}, 400)

        if not isinstance(path, str) or not path:
            return failed("model_path is required")
        file = Path(path) / "model.safetensors"
        if not file.is_file():
            return failed(f"Failed to get weights iterator: {path} (repository not found).")  # [DOC]
        from safetensors.torch import load_file

        try:
            tensors = await asyncio.to_thread(load_file, str(file))
        except Exception as e:  # noqa: BLE001 - reported to the client as SGLang would
            return failed(f"Failed to load weights from {path}: {e}")
        if obj.get("abort_all_requests"):
            for rid in list(self.runs):
                self._abort_run(rid, "Aborted by update_weights_from_disk.")
        async with self.weight_lock:
            target = int(getattr(self.engine, "weights_version", 0)) + 1
            self.names[target] = str(name) if name is not None else self.version
            try:
                await asyncio.to_thread(self.engine.update_weights, tensors)
            except Exception as e:  # noqa: BLE001
                self.names.pop(target, None)
                return failed(f"Failed to update weights: {e}")
            self.version = self.names.get(int(getattr(self.engine, "weights_version", target)), self.version)
        self.state.weight_loads.append({"model_path": path, "weight_version": name, "tensors": len(tensors)})
        message = "Succeeded to update model weights."
        if name is not None:
            message += f" Weight version updated to {name}."  # HS-new appends this
        return json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def get_weight_version(self, request: Request) -> Response:
        """GET /get_weight_version → {"weight_version"} [HS-new]."""
        return json_response({"weight_version": self.version})

    async def update_weight_version(self, request: Request) -> Response:
        """POST /update_weight_version {"new_version", "abort_all_requests" (default true)} [HS-new]."""
        obj = await _json_body(request, strict=False)
        if isinstance(obj, Response):
            return obj
        new = obj.get("new_version")
        if not isinstance(new, str) or not new:
            return json_response({"success": False, "message": "Failed to update weight version: new_version "
                                  "is required"}, 400)
        if obj.get("abort_all_requests", True):
            for rid in list(self.runs):
                self._abort_run(rid, "Aborted by update_weight_version.")
        self.version = new
        self.names[int(getattr(self.engine, "weights_version", 0))] = new
        return json_response({"success": True, "message": f"Weight version updated to {new}", "new_version": new})

    async def pause_generation(self, request: Request) -> Response:
        """POST /pause_generation {"mode": "abort" (default) | "retract" | "in_place"} [IO
        `PauseGenerationReqInput`]: abort ends running requests; the others hold them."""
        try:
            obj = await request.json()
        except ValueError:
            obj = {}
        mode = obj.get("mode", "abort") if isinstance(obj, dict) else "abort"
        if mode not in ("abort", "retract", "in_place"):
            return _error(f"unknown pause mode {mode!r}")
        self.unpaused.clear()
        if mode == "abort":
            for rid in list(self.runs):
                self._abort_run(rid, "Aborted by pause_generation.")
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: Request) -> Response:
        """POST /continue_generation [IO `ContinueGenerationReqInput`]."""
        self.unpaused.set()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def standin_log(self, request: Request) -> Response:
        """GET /_standin/log (see the module docstring)."""
        s = self.state
        return json_response({"requests": s.requests, "aborted": s.aborted, "disconnected": s.disconnected,
                              "weight_loads": s.weight_loads,
                              "weights_version": int(getattr(self.engine, "weights_version", 0)),
                              "weight_version": self.version, "outputs": dict(self.outputs)})

    async def standin_fault(self, request: Request) -> Response:
        """POST /_standin/fault {"mode", "count", "delay"}."""
        try:
            obj = await request.json()
            self.state.set_fault(obj.get("mode"), int(obj.get("count", 1)), obj.get("delay"))
        except (ValueError, TypeError, AttributeError) as e:
            return _error(str(e))
        return json_response({"mode": self.state.fault_mode, "count": self.state.fault_count,
                              "delay": self.state.delay})


class _UnknownKey(Exception):
    pass


def _abort(message: str, status: int | None) -> dict[str, Any]:
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


def _dumps(obj: Any) -> bytes:
    """orjson as SGLang writes it: NaN and ±inf become null [HS-new ORJSONResponse]."""
    import orjson

    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS)


async def _error_events(message: str):
    yield b"data: " + _dumps({"error": {"message": message}}) + b"\n\n"
    yield b"data: [DONE]\n\n"


async def _json_body(request: Request, *, strict: bool = True) -> dict[str, Any] | Response:
    """The JSON object body; the OpenAI-style routes (`strict`) also need the JSON content type
    [HS-new `validate_json_request`]."""
    if strict and "application/json" not in request.headers.get("content-type", ""):
        return _bad_request("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        obj = await request.json()
    except ValueError:
        return _bad_request("the body is not JSON")
    if not isinstance(obj, dict):
        return _bad_request("the body must be a JSON object")
    return obj


def create_app(engine: Any, model: str, state: StandinState, *, incremental: bool = False, segment: int = 4,
               max_queued: int | None = None, weight_version: str = "default", segment_delay: float = 0.0,
               served_model_name: str | None = None) -> Starlette:
    """The stand-in's ASGI app over `engine` (an hf engine on `model`).

    incremental: stream in SGLang's incremental form (--incremental-streaming-output) instead of
    the cumulative default. segment: tokens sampled per piece (one stream chunk each; a weight
    update can land between pieces). max_queued: unfinished requests allowed before "queue
    full". weight_version: the initial version name (SGLang's --weight-version). segment_delay:
    seconds to wait between pieces (a slow stream). served_model_name: the name /server_info
    reports (default `model`)."""
    s = _SGLangStandin(engine, model, state, incremental=incremental, segment=segment, max_queued=max_queued,
                       weight_version=weight_version, segment_delay=segment_delay,
                       served_model_name=served_model_name)
    routes = [
        Route("/generate", s.generate, methods=["POST", "PUT"]),
        Route("/abort_request", s.abort_request, methods=["POST"]),
        Route("/get_model_info", s.model_info, methods=["GET"]),
        Route("/server_info", s.server_info, methods=["GET"]),
        Route("/get_server_info", s.server_info, methods=["GET"]),
        Route("/tokenize", s.tokenize, methods=["POST"]),
        Route("/v1/tokenize", s.tokenize, methods=["POST"]),
        Route("/detokenize", s.detokenize, methods=["POST"]),
        Route("/v1/detokenize", s.detokenize, methods=["POST"]),
        Route("/health", s.health, methods=["GET"]),
        Route("/health_generate", s.health, methods=["GET"]),
        Route("/flush_cache", s.flush_cache, methods=["GET", "POST"]),
        Route("/update_weights_from_disk", s.update_weights_from_disk, methods=["POST"]),
        Route("/get_weight_version", s.get_weight_version, methods=["GET"]),
        Route("/update_weight_version", s.update_weight_version, methods=["POST"]),
        Route("/pause_generation", s.pause_generation, methods=["POST"]),
        Route("/continue_generation", s.continue_generation, methods=["POST"]),
        Route("/_standin/log", s.standin_log, methods=["GET"]),
        Route("/_standin/fault", s.standin_fault, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.standin = s
    return app
