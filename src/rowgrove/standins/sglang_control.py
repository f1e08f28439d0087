"""SGLang's routes besides /generate: /abort_request, /get_model_info, /server_info, tokenize
and detokenize, health, /flush_cache, the weight routes (/update_weights_from_disk,
/get_weight_version, /update_weight_version), /pause_generation and /continue_generation
[HS-new, IO, DOC], and the stand-in's own /_standin/log and /_standin/fault. Short names are the
sources listed in `rowgrove.standins.sglang`'s docstring; `ControlRoutes` is one part of the
stand-in there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from rowgrove.standins.common import json_response
from rowgrove.standins.sglang_request import bad_request, native_error, json_body

FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
              "requests, the operation will not be performed.)\n")


class ControlRoutes:
    """The handlers of these routes, for the stand-in (which holds `engine`, `state`, `tokenizer`,
    `runs`, `names`, `version`, `model_path`, `unpaused`, `weight_lock` and its settings)."""

    # ---- abort, info, tokenizer -----------------------------------------------------------

    async def abort_request(self, request: Request) -> Response:
        """POST /abort_request {"rid"} | {"abort_all": true}: 200, empty body; an unknown rid is a
        no-op [HS-new; IO `AbortReq`]. The aborted request ends with finish reason abort."""
        try:
            obj = await request.json()
        except ValueError:
            obj = {}
        if not isinstance(obj, dict):
            return native_error("the body must be a JSON object (AbortReq)")
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
        obj = await json_body(request)
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
        return bad_request("prompt must be a string or a list of strings")

    async def detokenize(self, request: Request) -> Response:
        """POST /detokenize and /v1/detokenize [HS-new; DOC]."""
        obj = await json_body(request)
        if isinstance(obj, Response):
            return obj
        tokens = obj.get("tokens")
        skip = bool(obj.get("skip_special_tokens", True))
        if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens):
            return json_response({"text": self._decode(tokens, skip)})
        if isinstance(tokens, list) and all(isinstance(t, list) for t in tokens):
            return json_response({"text": [self._decode(t, skip) for t in tokens]})
        return bad_request("tokens must be a list of ints or a list of lists of ints")

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
        obj = await json_body(request, strict=False)
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
        obj = await json_body(request, strict=False)
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
            return native_error(f"unknown pause mode {mode!r}")
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
            return native_error(str(e))
        return json_response({"mode": self.state.fault_mode, "count": self.state.fault_count,
                              "delay": self.state.delay})
