"""A stand-in for vLLM's OpenAI-compatible server (`vllm serve`), for tests and for trying rowgrove
without a GPU: the routes rowgrove's `vllm` engine uses, in vLLM's wire format, with real tokens
sampled by a real model (the hf engine) a few at a time, so a stream is really incremental and a
weight update can land in the middle of a request.

    app = create_app(make_engine("hf", "tiny"), "tiny", StandinState())
    python -m rowgrove.standins vllm --model tiny --port 8001

Where each shape comes from (vllm-project/vllm at the commits named):

    CP   vllm/entrypoints/openai/completion/protocol.py @ d5dba2d7b0ab9b98096560c69db7126b54b14d79
         (CompletionRequest, CompletionResponse, CompletionResponseStreamChoice, CompletionLogProbs)
    CS   vllm/entrypoints/openai/completion/serving.py @ cc139d8ea6ff4db984778a3e77e95e1d1c7f1362
         (request_output_to_completion_response, completion_stream_generator,
          _create_completion_logprobs)
    CR   vllm/entrypoints/openai/completion/api_router.py @ e7bcaef18dfc860abb2a8ebaf46596ebef9ae58b
         (JSONResponse(status_code=error.code), with_cancellation)
    EP   vllm/entrypoints/openai/engine/protocol.py @ d7e52523a55cfd60207c99d9f3b7ed527d2115b7
         (ErrorResponse/ErrorInfo, UsageInfo, ModelCard, extra="allow")
    MS   vllm/entrypoints/openai/models/serving.py @ 4fe4500477d5bbf2c2a467adacc60f7d215cd655
    RL-a vllm/entrypoints/serve/dev/rlhf/api_router.py @ 6fbea1171830682c53ecb7d3ae67495fa799e62f
         (/pause, /resume, /is_paused)
    RL-b the same file, newer version (vLLM PR #49040): /abort_requests,
         /weight_info, /update_weight_version
    RPC  vllm/entrypoints/serve/dev/rpc/api_router.py @ cd20a5785d36d73795dc3e87088ca370f9efe807
    CCH  vllm/entrypoints/serve/dev/cache/api_router.py @ b35f7c2b76d3cb04312ff6caa37b610163dbbf53
    TP   the tokenize protocol (TokenizeCompletionRequest / TokenizeChatRequest,
         vllm/entrypoints/serve/tokenize/protocol.py)

What the stand-in does not do (400 with a message naming the field, never silently ignored):
n > 1, batched prompts, echo, beam search, top_k / min_p / penalties other than "off",
ignore_eos, min_tokens, logit_bias, allowed_token_ids, prompt_logprobs in a stream, structured
outputs. `prompt_logprobs: k` (non-streamed) is answered as vLLM does (CS: `[null, {"<id>":
{"logprob", "rank", "decoded_token"}, ...}, ...]`, the prompt token's entry plus the k best), from
one teacher-forced pass of the sampling model; rowgrove's weight-sync check reads it.
Unknown fields are accepted, as vLLM does (EP: extra="allow"). The NCCL weight-transfer routes are
not served (a stand-in has no NCCL group); weights load from disk through
`/collective_rpc reload_weights`.

Pause (RL-a): `mode=keep` freezes new and in-flight requests between sampled pieces until
`/resume`; `wait` holds new requests and returns once in-flight ones finished; `abort` (vLLM's
default) ends in-flight requests with finish reason "abort". A client disconnect cancels the
sampling (CR: with_cancellation; for streams, Starlette's disconnect watch) and is logged in
`state.disconnected`; `/abort_requests` and pause-abort end requests with "abort" and log them
in `state.aborted`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rowgrove.errors import InputError
from rowgrove.standins.common import (
    Send,
    StandinCut,
    StandinState,
    WatchedResponse,
    control_routes,
    json_response,
    sample_segments,
)

VERSION = "0.11.0+rowgrove.standin"  # what GET /version reports
MAX_LOGPROBS = 20                      # vLLM's --max-logprobs default
STATUS_FAULTS = ("500", "502", "429", "503", "400")
# EP ErrorResponse.error.type per status (vLLM itself sends 400/404/500; the rest come from proxies)
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
               500: "InternalServerError", 502: "BadGatewayError", 503: "ServiceUnavailableError"}
_INT64 = (-(2**63), 2**63 - 1)


class _Refusal(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def error_response(message: str, status: int = 400, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """EP ErrorResponse: {"error": {"message", "type", "param", "code"}}, status = code (CR)."""
    return json_response({"error": {"message": message, "type": ERROR_TYPES.get(status, "BadRequestError"),
                                    "param": param, "code": status}}, status, headers)


@dataclass
class _Request:
    """One parsed /v1/completions request."""

    prompt: list[int]
    sampling: Any
    logprobs: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    as_token_ids: bool
    skip_special: bool
    include_stop_str: bool
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    prompt_logprobs: int | None = None


@dataclass
class _Piece:
    token_ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]] | None
    finish: str | None
    versions: list[int] = field(default_factory=list)


class _Text:
    """The output text as vLLM's detokenizer shows it: special tokens skipped or not, a matched
    stop string cut unless include_stop_str_in_output, text that may still become a stop string
    (or an incomplete UTF-8 character) held back until it is settled."""

    def __init__(self, tokenizer: Any, req: _Request):
        self.tokenizer = tokenizer
        self.req = req
        self.sent = ""

    def visible(self, ids: list[int], finished: bool) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=self.req.skip_special)
        if self.req.stop and not self.req.include_stop_str:
            hits = [text.find(s) for s in self.req.stop if s in text]
            if hits:
                return text[: min(hits)]
            if not finished:
                text = text[: max(0, len(text) - (max(len(s) for s in self.req.stop) - 1))]
        if not finished:
            text = text.rstrip("\ufffd")
        return text

    def delta(self, ids: list[int], finished: bool) -> str:
        now = self.visible(ids, finished)
        if not now.startswith(self.sent):
            return ""
        out, self.sent = now[len(self.sent):], now
        return out


def _base_id(rid: str) -> str:
    """vLLM's engine-side id of prompt 0 is f"cmpl-{base}-0" (CS); /abort_requests takes that one."""
    if rid.startswith("cmpl-"):
        rid = rid[5:]
        if rid.endswith("-0"):
            rid = rid[:-2]
    return rid


class VLLMStandin:
    """The app's state and handlers (see the module docstring); `create_app` builds the routes."""

    def __init__(self, engine: Any, model: str, state: StandinState, *, served_model_name: str | None,
                 max_model_len: int, dev_mode: bool, segment: int):
        from rowgrove.model.load import load_tokenizer, model_dir

        self.engine = engine
        self.model = str(model)
        self.folder = model_dir(str(model))
        self.state = state
        self.served = served_model_name or str(model)
        self.max_model_len = int(max_model_len)
        self.dev_mode = dev_mode
        self.segment = max(1, int(segment))
        # the served folder's tokenizer answers /tokenize and writes the text; `engine` samples
        self.tokenizer = load_tokenizer(str(model))
        self.vocab_size = int(getattr(engine, "vocab_size", len(self.tokenizer)))
        self.created = int(time.time())
        self.active: set[str] = set()   # admitted requests that are sampling (pause waits on these)

    # ---- request parsing (CP CompletionRequest) ---------------------------------------------

    def parse(self, body: dict[str, Any]) -> _Request:
        from rowgrove.engines.base import SamplingParams

        def get(name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
            v = body.get(name, default)
            if v is None:
                return default
            if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
                raise _Refusal(f"1 validation error for CompletionRequest: {name}: input should be {what}, "
                               f"got {v!r}", param=name)
            return v

        model = body.get("model")
        if model is not None and model != self.served:
            raise _Refusal(f"The model `{model}` does not exist.", 404, "model")
        for name, off in (("n", 1), ("echo", False), ("use_beam_search", False), ("top_k", None),
                          ("min_p", 0.0), ("repetition_penalty", 1.0), ("frequency_penalty", 0.0),
                          ("presence_penalty", 0.0), ("ignore_eos", False), ("min_tokens", 0),
                          ("logit_bias", None), ("allowed_token_ids", None),
                          ("structured_outputs", None), ("prompt_embeds", None)):
            v = body.get(name)
            if v is None or v == off or (name == "top_k" and v in (0, -1)) or (name == "logit_bias" and v == {}):
                continue
            raise _Refusal(f"the vLLM stand-in does not support {name}={v!r} (it samples with temperature "
                           "and top_p only): leave it unset", param=name)
        if body.get("suffix") is not None:
            raise _Refusal("suffix is not currently supported", param="suffix")
        rf = body.get("response_format")
        if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
            raise _Refusal("the vLLM stand-in does not support response_format", param="response_format")

        prompt = body.get("prompt")
        if prompt is None or prompt == "" or prompt == []:
            raise _Refusal("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True))))
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, list) and all(isinstance(p, list | str) for p in prompt):
            raise _Refusal("the vLLM stand-in serves one prompt per request: send a list of ints", param="prompt")
        else:
            raise _Refusal("1 validation error for CompletionRequest: prompt: input should be a list of ints, "
                           "a list of lists of ints, a string or a list of strings", param="prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise _Refusal(f"Token id {max(bad)} is out of vocabulary")  # vLLM names no param here

        stream = bool(get("stream", (bool,), False, "a boolean"))
        stream_options = body.get("stream_options")
        if stream_options and not stream:  # CP validate_stream_options
            raise _Refusal("Stream options can only be defined when `stream=True`.", param="stream_options")
        if stream_options is not None and not isinstance(stream_options, dict):
            raise _Refusal("stream_options must be an object", param="stream_options")
        logprobs = get("logprobs", (int,), None, "an integer")
        if logprobs is not None and logprobs < 0:  # CP check_logprobs
            raise _Refusal("`logprobs` must be a positive value.", param="logprobs")
        if logprobs is not None and logprobs > MAX_LOGPROBS:
            raise _Refusal(f"Requested sample logprobs of {logprobs}, which is greater than max allowed: "
                           f"{MAX_LOGPROBS}", param="logprobs")
        max_tokens = get("max_tokens", (int,), 16 if "max_tokens" not in body else None, "an integer")
        room = self.max_model_len - len(ids)
        if max_tokens is None:
            if room < 1:
                raise _Refusal(f"This model's maximum context length is {self.max_model_len} tokens. However, "
                               f"your request has {len(ids)} input tokens. Please reduce the length of the "
                               "input messages.", param="input_tokens")
            max_tokens = room
        if max_tokens < 1:
            raise _Refusal(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if len(ids) + max_tokens > self.max_model_len:  # wording of vllm/renderers/params.py (spec §4)
            raise _Refusal(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                           f"requested {max_tokens} output tokens and your prompt contains {len(ids)} input "
                           f"tokens, for a total of {len(ids) + max_tokens} tokens. Please reduce the length of "
                           "the input prompt or the number of requested output tokens.", param="input_tokens")
        stop_raw = body.get("stop")
        if stop_raw is None:
            stop: tuple[str, ...] = ()
        elif isinstance(stop_raw, str):
            stop = (stop_raw,) if stop_raw else ()
        elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
            stop = tuple(s for s in stop_raw if s)
        else:
            raise _Refusal("1 validation error for CompletionRequest: stop: input should be a string or a list "
                           "of strings", param="stop")
        stop_ids = get("stop_token_ids", (list,), [], "a list of integers")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
            raise _Refusal("stop_token_ids must be a list of integers", param="stop_token_ids")
        seed = get("seed", (int,), None, "an integer")
        if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
            raise _Refusal("seed must fit in a signed 64-bit integer", param="seed")
        temperature = float(get("temperature", (int, float), 1.0, "a number"))  # no generation-config default in tiny
        top_p = float(get("top_p", (int, float), 1.0, "a number"))
        try:
            sampling = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, stop=stop,
                                      stop_token_ids=tuple(stop_ids), seed=seed, top_logprobs=logprobs or 0)
        except InputError as e:
            raise _Refusal(str(e)) from None
        prompt_lps = get("prompt_logprobs", (int,), None, "an integer")
        if prompt_lps is not None and (prompt_lps < -1 or prompt_lps > MAX_LOGPROBS):
            raise _Refusal(f"`prompt_logprobs` must be between -1 and {MAX_LOGPROBS}", param="prompt_logprobs")
        if prompt_lps is not None and stream:
            raise _Refusal("the vLLM stand-in answers prompt_logprobs only without stream: leave it unset "
                           "or set stream false", param="prompt_logprobs")
        opts = stream_options or {}
        return _Request(
            prompt=ids, sampling=sampling, logprobs=logprobs, stream=stream,
            include_usage=stream and stream_options is not None and bool(opts.get("include_usage", True)),
            continuous_usage=stream and bool(opts.get("continuous_usage_stats", False)),
            return_token_ids=bool(get("return_token_ids", (bool,), False, "a boolean")),
            as_token_ids=bool(get("return_tokens_as_token_ids", (bool,), False, "a boolean")),
            skip_special=bool(get("skip_special_tokens", (bool,), True, "a boolean")),
            include_stop_str=bool(get("include_stop_str_in_output", (bool,), False, "a boolean")),
            stop=stop, stop_token_ids=tuple(stop_ids),
            prompt_logprobs=None if prompt_lps is None else (self.vocab_size if prompt_lps == -1 else prompt_lps),
        )

    def prompt_logprobs_obj(self, req: _Request) -> list[dict[str, Any] | None] | None:
        """CS's `prompt_logprobs`: None for the first prompt token, then per token a dict keyed by
        token id (as a string) of {logprob, rank, decoded_token}: the prompt token's own entry
        first, then the k best (raw log_softmax of one teacher-forced pass of the sampling model)."""
        if req.prompt_logprobs is None:
            return None
        import torch

        model = self.engine.model
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([req.prompt], device=device), use_cache=False).logits[0].float()
        logp_TV = torch.log_softmax(logits[:-1], dim=-1)
        out: list[dict[str, Any] | None] = [None]
        for row, tid in zip(logp_TV, req.prompt[1:], strict=True):
            lp = float(row[tid])
            entry = {str(tid): {"logprob": lp, "rank": int((row > row[tid]).sum()) + 1,
                                "decoded_token": self.tokenizer.decode([tid])}}
            if req.prompt_logprobs:
                vals, idx = torch.topk(row, min(req.prompt_logprobs, row.numel()))
                for rank, (v, t) in enumerate(zip(vals.tolist(), idx.tolist(), strict=True), start=1):
                    entry.setdefault(str(t), {"logprob": float(v), "rank": rank,
                                              "decoded_token": self.tokenizer.decode([t])})
            out.append(entry)
        return out

    # ---- sampling -------------------------------------------------------------------------

    async def pieces(self, req: _Request, rid: str, entry: dict[str, Any], fault: str | None):
        """The request's sampled pieces, pause, abort and faults applied; logs into `entry`."""
        state = self.state
        if fault == "hang":
            while rid not in state.abort_requested:
                await asyncio.sleep(0.02)
        elif fault == "slow":
            await asyncio.sleep(state.delay)
        while state.paused and rid not in state.abort_requested:  # new requests wait out any pause
            await asyncio.sleep(0.01)
        if rid in state.abort_requested:
            yield _Piece([], [], [] if req.logprobs else None, "abort")
            return
        self.active.add(rid)
        try:
            gen = sample_segments(self.engine, req.prompt, req.sampling, segment=self.segment)
            async with aclosing(gen):
                async for seg in gen:
                    n = len(seg.token_ids)
                    entry["token_ids"] += seg.token_ids
                    entry["logprobs"] += seg.logprobs
                    entry["weight_versions"] += [seg.version] * n
                    if seg.tops is not None:
                        entry["top_logprobs"] += [[list(p) for p in t] for t in seg.tops]
                    finish = "abort" if fault == "abort" else seg.finish_reason
                    yield _Piece(seg.token_ids, seg.logprobs, seg.tops, finish, [seg.version] * n)
                    if finish is not None:
                        return
                    if state.segment_delay:
                        await asyncio.sleep(state.segment_delay)
                    while state.paused and state.pause_mode == "keep" and rid not in state.abort_requested:
                        await asyncio.sleep(0.01)  # frozen between pieces until /resume
                    if rid in state.abort_requested:
                        yield _Piece([], [], [] if req.logprobs else None, "abort")
                        return
        finally:
            self.active.discard(rid)

    def stop_reason(self, req: _Request, ids: list[int], finish: str | None) -> int | str | None:
        """CP stop_reason: the stop id or stop string that ended the turn; None for EOS or length."""
        if finish != "stop" or not ids:
            return None
        last = ids[-1]
        if last == self.tokenizer.eos_token_id:
            return None
        if last in req.stop_token_ids or last in getattr(self.engine, "stop_ids", ()):
            return int(last)
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        hits = sorted((text.find(s), s) for s in req.stop if s in text)
        return hits[0][1] if hits else None

    def logprobs_obj(self, req: _Request, ids: list[int], lps: list[float],
                     tops: list[list[tuple[int, float]]] | None, offset: int) -> dict[str, Any] | None:
        """CS _create_completion_logprobs: per token its string (or "token_id:N"), its logprob
        (clamped at -9999), a dict of the sampled token first then the top `logprobs`
        alternatives (so logprobs + 1 entries, fewer when the sampled one is among them), and
        running text offsets."""
        if req.logprobs is None:
            return None

        def name(t: int) -> str:
            return f"token_id:{t}" if req.as_token_ids else self.tokenizer.decode([t])

        out: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        last_len = 0
        for j, (t, lp) in enumerate(zip(ids, lps, strict=False)):
            token = name(t)
            out["tokens"].append(token)
            out["token_logprobs"].append(max(lp, -9999.0))
            alt = {token: max(lp, -9999.0)}
            for a, v in (tops[j] if tops and j < len(tops) else [])[: req.logprobs]:
                alt.setdefault(name(a), max(v, -9999.0))
            out["top_logprobs"].append(alt)
            out["text_offset"].append(offset if j == 0 else out["text_offset"][-1] + last_len)
            last_len = len(token)
        return out

    # ---- routes ---------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        """POST /v1/completions (CR → CS create_completion)."""
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as e:
            return error_response(f"JSON decode error: {e}")
        if not isinstance(body, dict):
            return error_response("the request body must be a JSON object")
        # ES _base_request_id: the header wins over the body's request_id, else a random uuid
        rid = request.headers.get("x-request-id") or str(body.get("request_id") or uuid.uuid4().hex)
        self.state.requests.append(body)
        try:
            req = self.parse(body)
        except _Refusal as e:
            return error_response(str(e), e.status, e.param)
        fault = self.state.take_fault()
        entry = self.state.begin_generation(rid, "/v1/completions", req.prompt, fault)
        if fault in STATUS_FAULTS:
            entry["status"] = "refused"
            status = int(fault)
            headers = {"retry-after": "2"} if status in (429, 503) else None
            return error_response(f"stand-in fault {fault}: the server refused request cmpl-{rid}", status,
                                  headers=headers)

        def disconnected() -> None:
            entry["status"] = "disconnected"
            self.state.disconnected.append(rid)

        def ended() -> None:
            if self.state.running.get(rid) is response.task:
                del self.state.running[rid]
                self.state.abort_requested.discard(rid)

        produce = self.stream if req.stream else self.whole
        response = WatchedResponse(lambda send, handle: produce(send, handle, req, rid, entry, fault),
                                   disconnected, ended)
        return response  # type: ignore[return-value]

    def _finish_entry(self, entry: dict[str, Any], finish: str | None) -> None:
        entry["finish_reason"] = finish
        entry["status"] = "aborted" if finish == "abort" else "finished"

    async def whole(self, send: Send, handle: WatchedResponse, req: _Request, rid: str,
                    entry: dict[str, Any], fault: str | None) -> None:
        """The non-streaming answer (CS request_output_to_completion_response)."""
        self.state.running[rid] = handle.task  # type: ignore[assignment]
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish = None
        try:
            async with aclosing(self.pieces(req, rid, entry, fault)) as pieces:
                async for p in pieces:
                    ids += p.token_ids
                    lps += p.logprobs
                    tops += p.tops or []
                    finish = p.finish
        except Exception as e:  # noqa: BLE001 - the sampling engine failed: a 500, as vLLM's GenerationError
            entry["status"] = "failed"
            await _send_all(send, handle, error_response(f"Internal server error: {type(e).__name__}: {e}", 500))
            return
        self._finish_entry(entry, finish)
        text = _Text(self.tokenizer, req).visible(ids, True)
        out_ids, logprobs = list(ids), self.logprobs_obj(req, ids, lps, tops, 0)
        if fault == "bad_id" and out_ids:
            out_ids[0] = self.vocab_size + 7
        if fault == "short_logprobs" and logprobs is not None:
            for k in logprobs:
                logprobs[k] = logprobs[k][:-1]
        body = {
            "id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()), "model": self.served,
            "choices": [{
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
                "stop_reason": self.stop_reason(req, ids, finish),
                "token_ids": out_ids if req.return_token_ids else None,
                "prompt_logprobs": self.prompt_logprobs_obj(req),
                "prompt_token_ids": req.prompt if req.return_token_ids else None,
            }],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": len(req.prompt), "total_tokens": len(req.prompt) + len(ids),
                      "completion_tokens": len(ids), "prompt_tokens_details": None},
            "kv_transfer_params": None,
            # vLLM 0.32 (CP CompletionResponse): encoder-cache transfer and per-request metrics
            "ec_transfer_params": None, "metrics": None,
        }
        raw = orjson.dumps(body)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        if fault == "cut":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": raw[: len(raw) // 2], "more_body": True})
            raise StandinCut(f"request {rid}: body cut")
        handle.mark_done()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": raw, "more_body": False})

    async def stream(self, send: Send, handle: WatchedResponse, req: _Request, rid: str,
                     entry: dict[str, Any], fault: str | None) -> None:
        """The server-sent event stream (CS completion_stream_generator): one choice per chunk,
        deltas of text/token_ids/logprobs, prompt_token_ids in the first chunk only, the last delta
        with finish_reason and stop_reason, a usage chunk with `choices: []` when asked, then
        `data: [DONE]`."""
        self.state.running[rid] = handle.task  # type: ignore[assignment]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        cid, created = f"cmpl-{rid}", int(time.time())
        text = _Text(self.tokenizer, req)
        ids: list[int] = []
        first = True
        finish = None
        try:
            async with aclosing(self.pieces(req, rid, entry, fault)) as pieces:
                async for p in pieces:
                    offset = len(text.sent)
                    ids += p.token_ids
                    finish = p.finish
                    delta_ids = list(p.token_ids)
                    logprobs = self.logprobs_obj(req, p.token_ids, p.logprobs, p.tops, offset)
                    chunk_finish = finish
                    if first and fault == "bad_id" and delta_ids:
                        delta_ids[0] = self.vocab_size + 7
                    if first and fault == "short_logprobs" and logprobs is not None:
                        for k in logprobs:
                            logprobs[k] = logprobs[k][:-1]
                    if fault == "cut":
                        chunk_finish = None
                    choice = {
                        "index": 0, "text": text.delta(ids, finish is not None), "logprobs": logprobs,
                        "finish_reason": chunk_finish,
                        "stop_reason": self.stop_reason(req, ids, finish) if chunk_finish else None,
                        "prompt_token_ids": req.prompt if first and req.return_token_ids else None,
                        "token_ids": delta_ids if req.return_token_ids else None,
                    }
                    chunk = {"id": cid, "object": "text_completion", "created": created, "model": self.served,
                             "choices": [choice]}
                    if req.continuous_usage:  # CS dumps chunks with exclude_unset: no usage key otherwise
                        chunk["usage"] = {"prompt_tokens": len(req.prompt), "total_tokens": len(req.prompt) + len(ids),
                                          "completion_tokens": len(ids), "prompt_tokens_details": None}
                    await send({"type": "http.response.body", "body": _event(chunk), "more_body": True})
                    first = False
                    if fault == "cut":
                        raise StandinCut(f"request {rid}: stream cut")
        except StandinCut:
            raise
        except Exception as e:  # noqa: BLE001 - after the 200: an error event, then [DONE] (CS)
            entry["status"] = "failed"
            err = {"error": {"message": f"Internal server error: {type(e).__name__}: {e}",
                             "type": "InternalServerError", "param": None, "code": 500}}
            handle.mark_done()
            await send({"type": "http.response.body", "body": _event(err) + b"data: [DONE]\n\n", "more_body": False})
            return
        self._finish_entry(entry, finish)
        tail = b""
        if req.include_usage:  # dumped with exclude_none: no prompt_tokens_details
            tail += _event({"id": cid, "object": "text_completion", "created": created, "model": self.served,
                            "choices": [], "usage": {"prompt_tokens": len(req.prompt),
                                                     "total_tokens": len(req.prompt) + len(ids),
                                                     "completion_tokens": len(ids)}})
        handle.mark_done()
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})

    async def models(self, request: Request) -> Response:
        """GET /v1/models (MS show_available_models, EP ModelCard): `root` is the --model argument."""
        card = {"id": self.served, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": self.model, "parent": None, "max_model_len": self.max_model_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": self.created, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}
        return json_response({"object": "list", "data": [card]})

    async def tokenize(self, request: Request) -> Response:
        """POST /tokenize (TP): a string prompt, or the chat form (messages rendered with the
        served folder's chat template) → {"count", "max_model_len", "tokens", "token_strs"}."""
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        model = body.get("model")
        if model is not None and model != self.served:
            return error_response(f"The model `{model}` does not exist.", 404, "model")
        try:
            if body.get("messages") is not None:
                gen_prompt = bool(body.get("add_generation_prompt", True))
                cont = bool(body.get("continue_final_message", False))
                if gen_prompt and cont:
                    return error_response("Cannot set both `continue_final_message` and `add_generation_prompt` "
                                          "to True.")
                text = self.tokenizer.apply_chat_template(
                    body["messages"], tools=body.get("tools"), add_generation_prompt=gen_prompt,
                    continue_final_message=cont, tokenize=False, chat_template=body.get("chat_template"),
                    **(body.get("chat_template_kwargs") or {}))
                ids = list(self.tokenizer.encode(text, add_special_tokens=bool(body.get("add_special_tokens", False))))
            elif isinstance(body.get("prompt"), str):
                ids = list(self.tokenizer.encode(body["prompt"],
                                                 add_special_tokens=bool(body.get("add_special_tokens", True))))
            else:
                return error_response("1 validation error: prompt must be a string (or send messages)", param="prompt")
        except Exception as e:  # noqa: BLE001 - a template error is the caller's: 400 as in vLLM
            return error_response(f"{type(e).__name__}: {e}")
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
        return json_response({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                              "token_strs": strs})

    async def detokenize(self, request: Request) -> Response:
        """POST /detokenize {"tokens": [ids]} → {"prompt": text}."""
        body = await _json_body(request)
        if isinstance(body, Response):
            return body
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return error_response("tokens must be a list of integers", param="tokens")
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            return error_response(f"Token id {max(bad)} is out of vocabulary", param="tokens")
        return json_response({"prompt": self.tokenizer.decode(tokens)})

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        return json_response({"version": VERSION})

    # ---- dev routes (VLLM_SERVER_DEV_MODE=1) ------------------------------------------------

    async def pause(self, request: Request) -> Response:
        """POST /pause?mode=abort|wait|keep (RL-a; default abort) → {"status": "paused"}."""
        mode = request.query_params.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return error_response(f"mode: input should be 'abort', 'wait' or 'keep', got {mode!r}", param="mode")
        state = self.state
        state.paused, state.pause_mode = True, mode
        state.event("/pause", mode=mode, in_flight=sorted(self.active))
        if mode == "abort":
            for rid in sorted(self.active):
                state.abort_requested.add(rid)
                state.aborted.append(rid)
        if mode in ("abort", "wait"):
            while self.active:
                await asyncio.sleep(0.01)
        return json_response({"status": "paused"})

    async def resume(self, request: Request) -> Response:
        """POST /resume (RL-a) → {"status": "resumed"}."""
        self.state.paused, self.state.pause_mode = False, None
        self.state.event("/resume")
        return json_response({"status": "resumed"})

    async def is_paused(self, request: Request) -> Response:
        return json_response({"is_paused": self.state.paused})

    async def collective_rpc(self, request: Request) -> Response:
        """POST /collective_rpc {"method", "args", "kwargs", "timeout"} (RPC). Only
        `reload_weights` (kwargs `weights_path`: a folder of *.safetensors, default the served
        folder) is implemented: the tensors are loaded and handed to the sampling engine's
        `update_weights` (in a thread) → {"results": [null]} (one worker)."""
        body = await _json_body(request, detail=True)
        if isinstance(body, Response):
            return body
        method = body.get("method")
        if method is None:
            return json_response({"detail": "Missing 'method' in request body"}, 400)
        if method != "reload_weights":
            # vLLM answers a bare 500 when a worker has no such method; a message helps more
            return json_response({"detail": f"the stand-in's worker has no method {method!r} (it implements "
                                            "reload_weights)"}, 500)
        kwargs = body.get("kwargs") or {}
        path = Path(str(kwargs.get("weights_path") or self.folder))
        try:
            loaded = await asyncio.to_thread(self._reload, path)
        except Exception as e:  # noqa: BLE001 - a failed load is a 500, the old weights stay
            self.state.event("/collective_rpc", method=method, weights_path=str(path), error=str(e))
            return json_response({"detail": f"reload_weights({path}) failed: {type(e).__name__}: {e}"}, 500)
        self.state.weight_loads.append({"path": str(path), **loaded,
                                        "weights_version": int(getattr(self.engine, "weights_version", 0)),
                                        "paused": self.state.paused, "pause_mode": self.state.pause_mode,
                                        "in_flight": sorted(self.active)})
        self.state.event("/collective_rpc", method=method, weights_path=str(path))
        return json_response({"results": [None]})

    def _reload(self, path: Path) -> dict[str, Any]:
        from safetensors.torch import load_file

        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        files = [f for f in files if f.is_file()]
        if not files:
            raise FileNotFoundError(f"no *.safetensors under {path}")
        tensors: dict[str, Any] = {}
        for f in files:
            tensors.update(load_file(str(f)))
        self.engine.update_weights(tensors)
        return {"files": [f.name for f in files], "tensors": len(tensors)}

    async def reset_prefix_cache(self, request: Request) -> Response:
        """POST /reset_prefix_cache (CCH) → 200 `{"success": true}` (vLLM 0.32; older: empty body)."""
        self.state.event("/reset_prefix_cache")
        return json_response({"success": True})

    async def weight_info(self, request: Request) -> Response:
        """GET /weight_info (RL-b, PR #49040) → {"weight_version": str} ("default" at start)."""
        return json_response({"weight_version": self.state.weight_version})

    async def update_weight_version(self, request: Request) -> Response:
        """POST /update_weight_version {"new_version": str} (RL-b) → {"success": true, "new_version"}."""
        body = await _json_body(request, detail=True)
        if isinstance(body, Response):
            return body
        new = body.get("new_version")
        if not isinstance(new, str):
            return error_response("new_version: field required (a string)", param="new_version")
        self.state.weight_version = new
        self.state.event("/update_weight_version", new_version=new)
        return json_response({"success": True, "new_version": new})

    async def abort_requests(self, request: Request) -> Response:
        """POST /abort_requests {"request_ids": [...]} (RL-b): those requests (ids as the engine
        knows them, "cmpl-<X-Request-Id>-0"; the bare id works too), or all when empty, end with
        finish reason abort → {"status": "aborted", "aborted": n}."""
        body = await _json_body(request, detail=True)
        if isinstance(body, Response):
            return body
        ids = body.get("request_ids") or []
        running = list(self.state.running)
        wanted = {_base_id(str(i)) for i in ids}
        targets = [r for r in running if r in wanted] if ids else running
        for rid in targets:
            self.state.abort_requested.add(rid)
            self.state.aborted.append(rid)
        self.state.event("/abort_requests", request_ids=list(ids), aborted=targets)
        return json_response({"status": "aborted", "aborted": len(ids) if ids else len(targets)})


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _json_body(request: Request, detail: bool = False) -> dict[str, Any] | Response:
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as e:
        return json_response({"detail": f"JSON decode error: {e}"}, 400) if detail else error_response(
            f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return json_response({"detail": "Request body must be a JSON object"}, 400) if detail else error_response(
            "the request body must be a JSON object")
    return body


async def _send_all(send: Send, handle: WatchedResponse, response: Response) -> None:
    handle.mark_done()
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


async def _not_found(request: Request, exc: HTTPException) -> Response:
    # FastAPI's shape for an unknown route ({"detail": "Not Found"}), as vLLM answers without dev mode
    return json_response({"detail": exc.detail or "Not Found"}, exc.status_code)


def create_app(engine: Any, model: str, state: StandinState, *, served_model_name: str | None = None,
               max_model_len: int = 4096, dev_mode: bool = True, segment: int = 4) -> Starlette:
    """The stand-in's Starlette app: `engine` samples (an hf engine), `model` is the folder (or
    tiny spec) it serves, `state` holds faults and the log. `served_model_name` as vLLM's
    --served-model-name (default `model`); `dev_mode` as VLLM_SERVER_DEV_MODE=1 (the pause,
    weight and abort routes; without it they answer 404); `segment` tokens are sampled per piece."""
    s = VLLMStandin(engine, model, state, served_model_name=served_model_name, max_model_len=max_model_len,
                    dev_mode=dev_mode, segment=segment)
    routes = [
        Route("/v1/completions", s.completions, methods=["POST"]),
        Route("/v1/models", s.models, methods=["GET"]),
        Route("/tokenize", s.tokenize, methods=["POST"]),
        Route("/detokenize", s.detokenize, methods=["POST"]),
        Route("/health", s.health, methods=["GET"]),
        Route("/version", s.version, methods=["GET"]),
        *control_routes(state, engine),
    ]
    if dev_mode:
        routes += [
            Route("/pause", s.pause, methods=["POST"]),
            Route("/resume", s.resume, methods=["POST"]),
            Route("/is_paused", s.is_paused, methods=["GET"]),
            Route("/collective_rpc", s.collective_rpc, methods=["POST"]),
            Route("/reset_prefix_cache", s.reset_prefix_cache, methods=["POST"]),
            Route("/weight_info", s.weight_info, methods=["GET"]),
            Route("/update_weight_version", s.update_weight_version, methods=["POST"]),
            Route("/abort_requests", s.abort_requests, methods=["POST"]),
        ]
    app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_found})
    app.state.standin = s
    return app
