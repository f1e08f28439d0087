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

The server is in four modules: this one (the app; /v1/completions, /v1/models, tokenize, health,
version), `vllm_request` (parsing and checking a completion request), `vllm_output` (sampling and the
response and stream bodies) and `vllm_dev` (the dev-mode routes).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rowgrove.standins.common import StandinState, WatchedResponse, control_routes, json_response
from rowgrove.standins.vllm_dev import DevRoutes
from rowgrove.standins.vllm_output import CompletionOutput
from rowgrove.standins.vllm_request import CompletionParsing, json_body, Refusal, error_response

VERSION = "0.11.0+rowgrove.standin"  # what GET /version reports
STATUS_FAULTS = ("500", "502", "429", "503", "400")


class VLLMStandin(CompletionParsing, CompletionOutput, DevRoutes):
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
        except Refusal as e:
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
        body = await json_body(request)
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
                # as vLLM's chat parsing hands them to the template (vllm/entrypoints/chat_utils.py:
                # content null -> "", tool-call arguments decoded), which rowgrove's preprocess models
                from rowgrove.gateway.core.preprocess import detect_content_format, engine_messages

                messages = engine_messages(body["messages"], detect_content_format(self.tokenizer.chat_template or ""))
                text = self.tokenizer.apply_chat_template(
                    messages, tools=body.get("tools"), add_generation_prompt=gen_prompt,
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
        body = await json_body(request)
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
