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

The server is in four modules: this one (the app and /generate), `sglang_request` (parsing a
/generate body; the error bodies), `sglang_output` (sampling a request and its output objects)
and `sglang_control` (the other routes).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from rowgrove.errors import InputError
from rowgrove.standins.common import StandinState
from rowgrove.standins.sglang_control import ControlRoutes
from rowgrove.standins.sglang_output import GenerateOutput, finish_abort, CutBody, CutStream, sglang_dumps, error_events
from rowgrove.standins.sglang_request import (
    GenerateParsing,
    native_error,
    http_error,
    GenerateRun,
    UnknownKey,
    json_body,
)

QUEUE_FULL = "The request queue is full."


class _SGLangStandin(GenerateParsing, GenerateOutput, ControlRoutes):
    """The app's state and /generate (see the module docstring); `create_app` builds the routes."""

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
        self.runs: dict[str, GenerateRun] = {}
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
        obj = await json_body(request, strict=False, kind="GenerateReqInput")
        if isinstance(obj, Response):
            return obj
        self.state.requests.append(obj)
        fault = self.state.take_fault()
        if fault in ("500", "502"):
            return http_error(int(fault), f"stand-in fault: {fault}")
        if fault in ("429", "503"):
            return http_error(int(fault), f"stand-in fault: {fault}", {"retry-after": "2"})
        if fault == "400":
            return native_error("stand-in fault: 400")
        stream = bool(obj.get("stream", False))
        try:
            run = self._parse(obj, fault)
        except UnknownKey:
            # SamplingParams(**params) raises TypeError: uncaught, a bare 500 (spec §5)
            return PlainTextResponse("Internal Server Error", 500)
        except ValueError as e:
            if stream:  # the ValueError surfaces inside the stream: 200, an error event, [DONE] [HS-new]
                return StreamingResponse(error_events(str(e)), media_type="text/event-stream")
            return native_error(str(e))
        if self.max_queued is not None and len(self.state.running) >= self.max_queued:
            # the scheduler aborts with status 503 [RE `_handle_abort_finish_reason`]: a 503
            # ErrorResponse when not streaming, an abort chunk under 200 when streaming
            if not stream:
                return http_error(503, QUEUE_FULL)
            run.finish = finish_abort(QUEUE_FULL, 503)
            return CutStream(self._events(run, request, started=False), media_type="text/event-stream")
        self._start(run)
        if stream:
            return CutStream(self._events(run, request), media_type="text/event-stream")
        if await self._wait(run, request):
            return Response(status_code=200)  # nobody reads it
        if run.error is not None:
            return native_error(run.error)
        body = sglang_dumps(self._output(run, 0, len(run.ids), final=True))
        if fault == "cut":
            return CutBody(body, media_type="application/json")
        return Response(body, media_type="application/json")


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
