"""vLLM's dev-mode routes (served with VLLM_SERVER_DEV_MODE=1, else 404): pause / resume /
is_paused (RL-a), /collective_rpc reload_weights (RPC), /reset_prefix_cache (CCH), and
/weight_info, /update_weight_version, /abort_requests (RL-b, vLLM PR #49040). Short names are the
sources listed in `rowgrove.standins.vllm`'s docstring; `DevRoutes` is one part of `VLLMStandin`
there.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rowgrove.standins.common import json_response
from rowgrove.standins.vllm_request import json_body, error_response


def base_request_id(rid: str) -> str:
    """vLLM's engine-side id of prompt 0 is f"cmpl-{base}-0" (CS); /abort_requests takes that one."""
    if rid.startswith("cmpl-"):
        rid = rid[5:]
        if rid.endswith("-0"):
            rid = rid[:-2]
    return rid


class DevRoutes:
    """The dev routes' handlers, for `VLLMStandin` (which holds `engine`, `state`, `folder` and
    the `active` set)."""

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
        body = await json_body(request, detail=True)
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
        body = await json_body(request, detail=True)
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
        body = await json_body(request, detail=True)
        if isinstance(body, Response):
            return body
        ids = body.get("request_ids") or []
        running = list(self.state.running)
        wanted = {base_request_id(str(i)) for i in ids}
        targets = [r for r in running if r in wanted] if ids else running
        for rid in targets:
            self.state.abort_requested.add(rid)
            self.state.aborted.append(rid)
        self.state.event("/abort_requests", request_ids=list(ids), aborted=targets)
        return json_response({"status": "aborted", "aborted": len(ids) if ids else len(targets)})
