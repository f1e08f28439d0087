"""Benchmark: rowgrove's gateway and four peer capture proxies side by side, in one run, with the
same client and the same traffic (bench_deployed's 12-call agent conversation), at c=1 and c=32.

Variants, measured in interleaved rounds (every variant once per round; medians over rounds):

    rowgrove null engine   bench_gateway's null-engine gateway (the floor; `rowgrove bench gateway`'s
                           own `null_round`: text turns, tiny vocabulary, Server-Timing)
    rowgrove deployed      `rowgrove serve --engine vllm` in front of the vLLM stand-in on Qwen3's real
                           vocabulary, measured by bench_deployed.measure() exactly as `rowgrove bench
                           gateway` measures it (added = Server-Timing minus the stand-in's own time)
    rowgrove (same loop)   the same `rowgrove serve --engine vllm`, driven by this file's peer loop in
                           front of the shared upstream below (added = end to end minus upstream time,
                           the peers' measure), so the peers' rows and rowgrove's compare like for like
    rllm                   rllm-model-gateway 0.1.0 (`create_app(GatewayConfig)`, SQLite trace store)
    agentlightning         agentlightning 1.0.2 (`agentlightning.server.app.create_app`: its LLM proxy)
    nemo-gym               nemo-gym 0.7.0 `responses_api_models/vllm_model` (VLLMModel, configured as
                           its configs/vllm_model_for_training.yaml: token-id capture on)
    verifiers              verifiers 0.4.0 `InterceptionServer` with its train client (`TrainClient`:
                           renders the prompt itself and calls vLLM's /inference/v1/generate)

The shared upstream (this file's `--serve-upstream`, one process, the main venv) is vLLM-shaped:
`/v1/chat/completions` in vLLM's wire format (UP below), rendering and tokenizing every prompt for
real with Qwen3's tokenizer as vLLM does; `/inference/v1/generate` (token ids in) for verifiers; and,
for everything else (/v1/completions, /v1/models, /tokenize, /health), rowgrove's vLLM stand-in over
bench_long_conversation's instant engine. Every route answers the same one tool call, `read_file`
with a path named after the prompt's token count, so each conversation continues the same way
behind every proxy. The upstream records each request's span (perf_counter, the machine's monotonic
clock, from its ASGI entry to handing on the last body message); a call's upstream time is the sum
of the spans that start inside that call's client-side interval (c=1 only: at c=32 calls overlap), so a
peer that calls the upstream twice per call (NeMo Gym's /tokenize) is charged both.

    UP  vllm-project/vllm vllm/entrypoints/openai/chat_completion/protocol.py
        @ 002032ee2b18e1f7bd924ec47b62504ba3866063 (ChatMessage, ChatCompletionLogProbs(Content),
        ChatCompletionResponseChoice: token_ids when return_token_ids; ChatCompletionResponse:
        prompt_token_ids when return_token_ids; return_tokens_as_token_ids: "token_id:<id>" tokens)

Per round and variant: c=1, four conversations one after the other (the proxy's CPU read around each
call, all threads of its process and of any child processes alive after its warm-up; median per call); c=32,
32 conversations at once (CPU over the burst / calls, and requests/s); the upstream's CPU per call
beside. Each conversation's session is set up as the peer's docs say (outside the timed calls):
rowgrove POST /v1/rollouts; rllm POST /sessions (URL /sessions/{id}/v1); agentlightning POST
/api/rollouts (URL /proxy/rollout/{id}/attempt/{a}/mode/train/openai/v1); verifiers a RolloutSession
registered on the server (its Bearer secret); NeMo Gym its session cookie. All proxies log at
warning level (as bench_deployed runs rowgrove); each runs from its own venv's python, as a user would.

The peers are installed outside the repository, one venv each, under --venvs (default $ROWGROVE_PEERS
or /work/peers); none pulls torch (checked with `pip install --dry-run`):

    P=/work/peers
    ~/.pyenv/versions/3.11.7/bin/python -m venv $P/rllm && $P/rllm/bin/pip install rllm-model-gateway==0.1.0
    ~/.pyenv/versions/3.12.1/bin/python -m venv $P/agentlightning && $P/agentlightning/bin/pip install agentlightning==1.0.2
    ~/.pyenv/versions/3.13.0/bin/python -m venv $P/nemo-gym && $P/nemo-gym/bin/pip install --ignore-requires-python nemo-gym==0.7.0
    ~/.pyenv/versions/3.11.7/bin/python -m venv $P/verifiers && $P/verifiers/bin/pip install verifiers==0.4.0

A peer whose venv is missing is skipped with one line naming its install command; with none
installed (or without Qwen3's tokenizer) nothing is measured or written, so `rowgrove bench`, which
runs every benchmark, leaves peers.json as it is. The result's `goals` are issue #37's for the
deployed path (CPU per call at c=32 <= 0.6 ms and at c=1 <= 0.9 ms, added p50 at c=1 at most NeMo
Gym's, call 200 <= 2x call 10), printed MET or MISSED by `rowgrove bench`. Results:
bench/results/peers.json (never written with --quick); table in docs/gateway.md ("Peers side by side").

    PYTHONPATH=src .venv/bin/python bench/bench_peers.py [--rounds 5] [--quick] [--peers rllm,verifiers] [--venvs DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics as st
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests")]

import bench_deployed as bdp
import bench_gateway as bg

bl = bdp.bl
RESULTS = HERE / "results" / "peers.json"
MODEL = "qwen3-tiny"  # the served model name every proxy is configured with
CALLS = bdp.CALLS


# -- the peers --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """One capture proxy: its venv, how to install it, and the launcher its venv's python runs
    (`launcher PORT UPSTREAM_URL TMP MODEL_DIR MODEL_NAME`)."""

    name: str
    package: str
    python: str
    install: str
    launcher: str
    ready: str  # a GET path that answers once the server is up


PY311, PY312, PY313 = ("~/.pyenv/versions/3.11.7/bin/python", "~/.pyenv/versions/3.12.1/bin/python",
                       "~/.pyenv/versions/3.13.0/bin/python")

RLLM = """
import sys, uvicorn
from rllm_model_gateway.models import GatewayConfig
from rllm_model_gateway.server import create_app
port, up, tmp = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# as its CLI's main() builds it (`--worker URL --db-path PATH`), SQLite store, defaults otherwise
cfg = GatewayConfig(host="127.0.0.1", port=port, workers=[{"url": up + "/v1", "worker_id": "0"}],
                    db_path=tmp + "/loop-rllm.db", log_level="WARNING")
uvicorn.run(create_app(cfg), host="127.0.0.1", port=port, log_level="warning")
"""

AGENTLIGHTNING = """
import sys, uvicorn
from agentlightning.server.app import create_app
port, up, model = int(sys.argv[1]), sys.argv[2], sys.argv[5]
# its config/server.yaml with the served model's name; __main__ runs it the same way (Hydra aside)
cfg = {"host": "127.0.0.1", "port": port, "key": "",
       "default_proxy": {"model_name": model, "include_log_probs": True, "include_routed_experts": False,
                         "train": {"temperature": 1}, "val": {"temperature": 0.7}}}
uvicorn.run(create_app(cfg), host="127.0.0.1", port=port, workers=1, timeout_keep_alive=120,
            log_level="warning")
"""

NEMO_GYM = """
import sys
from unittest.mock import MagicMock
import uvicorn
import nemo_gym.server_utils as su
su.get_global_config_dict = lambda *a, **k: {}  # as its own tests build the server (no Hydra, no head server)
from nemo_gym.server_utils import ServerClient
from responses_api_models.vllm_model.app import VLLMModel, VLLMModelConfig
port, up, model = int(sys.argv[1]), sys.argv[2], sys.argv[5]
# configs/vllm_model_for_training.yaml: token-id capture on, prompt ids via /tokenize, reasoning parser
config = VLLMModelConfig(host="127.0.0.1", port=port, base_url=up + "/v1", api_key="EMPTY", model=model,
                         entrypoint="app.py", name="policy_model", return_token_id_information=True,
                         request_prompt_and_generation_token_ids=False, uses_reasoning_parser=True)
server = VLLMModel(config=config, server_client=MagicMock(spec=ServerClient, global_config_dict={}))
app = server.setup_webserver()
server.setup_exception_middleware(app)
# run_webserver's uvicorn settings: httptools, keep-alive 30 s, no access log
uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", timeout_keep_alive=30, access_log=False,
            log_level="warning")
"""

VERIFIERS = """
import asyncio, os, sys
from aiohttp import web
from verifiers.v1.clients.client import ModelContext
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.interception.server import InterceptionServer
from verifiers.v1.session import RolloutSession
from verifiers.v1.state import State
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
import verifiers.v1 as vf
port, up, tmp, folder, model = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
os.environ["BENCH_KEY"] = "EMPTY"

async def main():
    server = InterceptionServer()  # loopback, no tunnel: what a local eval/train run starts
    await server.start()
    client = TrainClientConfig(base_url=up + "/v1", api_key_var="BENCH_KEY", renderer={"name": "qwen3"},
                               renderer_model_name=folder)

    async def session(request):
        # what Rollout builds for a rollout (trace + session on the model context), minus the harness
        trace = Trace(task=TraceTask(type="Bench", data={}), state=State(), agent=AgentInfo(config=vf.AgentConfig()))
        secret, _ = server.register(RolloutSession(ctx=ModelContext(model=model, client=client), trace=trace))
        return web.json_response({"base_url": server.base_url, "key": secret})

    async def health(request):
        return web.json_response({"ok": True})

    admin = web.Application()
    admin.router.add_post("/_bench/session", session)
    admin.router.add_get("/_bench/health", health)
    runner = web.AppRunner(admin, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()

asyncio.run(main())
"""

PEERS = {p.name: p for p in (
    Peer("rllm", "rllm-model-gateway==0.1.0", PY311, "", RLLM, "/health"),
    Peer("agentlightning", "agentlightning==1.0.2", PY312, "", AGENTLIGHTNING, "/healthz"),
    Peer("nemo-gym", "nemo-gym==0.7.0", PY313, "--ignore-requires-python ", NEMO_GYM, "/openapi.json"),
    Peer("verifiers", "verifiers==0.4.0", PY311, "", VERIFIERS, "/_bench/health"),
)}


def install_line(peer: Peer, venvs: Path) -> str:
    v = venvs / peer.name
    return f"{peer.python} -m venv {v} && {v}/bin/pip install {peer.install}{peer.package}"


def peer_version(python: Path, package: str) -> str:
    dist = package.split("==")[0]
    out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                         check=False, capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or "?"


# -- the shared upstream (a child process of this file) ---------------------------------------------


def serve_upstream(port: int, folder: str) -> None:
    """The vLLM-shaped upstream (module docstring): chat completions and generate here, the rest
    from rowgrove's vLLM stand-in; every request's span kept for GET /_bench/spans (read and cleared)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Mount, Route

    from rowgrove.gateway.core.preprocess import detect_content_format, engine_messages
    from rowgrove.model.load import end_of_turn_id, load_tokenizer
    from rowgrove.standins.common import StandinState
    from rowgrove.standins.vllm import create_app
    from rowgrove.toolcalls import format_assistant_text

    tok = load_tokenizer(folder)
    eot = end_of_turn_id(tok)
    # the messages as vLLM's chat parsing hands them to the template (content null as "",
    # tool-call arguments decoded): rowgrove's model of it, which the stand-in's /tokenize uses too
    content_format = detect_content_format(tok.chat_template or "")
    state = StandinState()
    state.requests = bl._Drop()  # type: ignore[assignment]
    standin = create_app(bl.InstantToolEngine(tok), folder, state, segment=1 << 20, max_model_len=bl.CONTEXT,
                         served_model_name=MODEL)
    spans: list[tuple[float, float, str]] = []

    def reply(n_prompt: int) -> tuple[list[int], dict[str, Any]]:
        """The one tool call (InstantToolEngine's), its token ids and its parsed form."""
        args = {"path": f"src/module_{n_prompt}.py"}
        ids = list(tok.encode(format_assistant_text(None, [("read_file", args)]), add_special_tokens=False)) + [eot]
        call = {"id": f"chatcmpl-tool-{uuid.uuid4().hex}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps(args)}}
        return ids, call

    def logprobs(ids: list[int], as_ids: bool) -> dict[str, Any]:
        content = []
        for i in ids:
            token = f"token_id:{i}" if as_ids else tok.decode([i])
            content.append({"token": token, "logprob": 0.0, "bytes": list(token.encode()), "top_logprobs": []})
        return {"content": content}

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        text = tok.apply_chat_template(engine_messages(body["messages"], content_format), tools=body.get("tools"), tokenize=False,
                                       add_generation_prompt=body.get("add_generation_prompt", True),
                                       continue_final_message=body.get("continue_final_message", False),
                                       **(body.get("chat_template_kwargs") or {}))
        prompt = list(tok.encode(text, add_special_tokens=False))
        ids, call = reply(len(prompt))
        rti = bool(body.get("return_token_ids"))
        choice = {"index": 0,
                  "message": {"role": "assistant", "content": None, "refusal": None, "annotations": None,
                              "audio": None, "function_call": None, "tool_calls": [call], "reasoning": None},
                  "logprobs": logprobs(ids, bool(body.get("return_tokens_as_token_ids"))) if body.get("logprobs") else None,
                  "finish_reason": "tool_calls", "stop_reason": None, "token_ids": ids if rti else None,
                  "routed_experts": None}
        out = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
               "model": MODEL, "choices": [choice], "service_tier": None, "system_fingerprint": None,
               "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(ids),
                         "completion_tokens": len(ids), "prompt_tokens_details": None},
               "prompt_logprobs": None, "prompt_token_ids": prompt if rti else None, "prompt_text": None,
               "kv_transfer_params": None}
        return Response(orjson.dumps(out), media_type="application/json")

    async def generate(request: Request) -> Response:
        # vLLM's token-in /inference/v1/generate, as renderers.client.generate reads it
        body = orjson.loads(await request.body())
        ids, _ = reply(len(body["token_ids"]))
        out = {"request_id": f"gen-{uuid.uuid4().hex}",
               "choices": [{"index": 0, "logprobs": logprobs(ids, True), "finish_reason": "stop", "token_ids": ids}],
               "prompt_logprobs": None, "kv_transfer_params": None}
        return Response(orjson.dumps(out), media_type="application/json")

    async def read_spans(request: Request) -> Response:
        body = orjson.dumps(spans)
        spans.clear()
        return Response(body, media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/inference/v1/generate", generate, methods=["POST"]),
                            Route("/_bench/spans", read_spans, methods=["GET"]),
                            Mount("/", standin)])

    async def timed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"].startswith("/_bench/") or scope["path"] == "/health":
            return await app(scope, receive, send)  # /health: rllm's background probe, part of no call
        t0 = time.perf_counter()

        async def timed_send(message: dict[str, Any]) -> None:
            # the end is read before the last body is handed on: on a busy machine the proxy
            # may have the bytes and have answered its client before this process runs again
            if message["type"] == "http.response.body" and not message.get("more_body"):
                spans.append((t0, time.perf_counter(), scope["path"]))
            await send(message)

        return await app(scope, receive, timed_send)

    uvicorn.run(timed, host="127.0.0.1", port=port, loop="uvloop", log_level="warning", access_log=False)


# -- processes --------------------------------------------------------------------------------------


class Server:
    """A child process serving HTTP on a free port; returned once GET `ready` gets any answer."""

    def __init__(self, cmd: list[str], ready: str, env: dict[str, str], log: Path):
        self.port = bl._free_port()
        self.log = log
        LOGS[Path(log).stem] = log
        with open(log, "wb") as f:
            cmd = [c.replace("{port}", str(self.port)) for c in cmd]
            self.proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(f"GET {ready} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    if s.recv(16).startswith(b"HTTP/1."):
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{' '.join(cmd[:3])} did not start:\n{tail}")
            time.sleep(0.2)
        self.pids = [self.proc.pid]

    def adopt_children(self) -> None:
        """Count the CPU of the child processes alive now too (read once: after the warm-up)."""
        self.pids = [self.proc.pid, *_descendants(self.proc.pid)]

    def cpu_ns(self) -> int:
        total = 0
        for pid in self.pids:
            try:
                total += bl.cpu_ns(pid)
            except OSError:
                pass  # a child that ended
        return total

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


# -- the client -------------------------------------------------------------------------------------


class Conn(bl.Conn):
    """bench_long_conversation's keep-alive connection, with extra request headers."""

    async def send(self, method: str, path: str, body: bytes = b"",
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.w.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{extra}Content-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.r.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs: dict[str, str] = {}
        for ln in lines[1:]:
            if ln:
                k, _, v = ln.partition(":")
                hdrs.setdefault(k.lower(), v.strip())  # the first Set-Cookie is the session's
        data = await self.r.readexactly(int(hdrs["content-length"]))
        return status, hdrs, data


async def _json(conn: Conn, method: str, path: str, body: Any = None) -> Any:
    status, _, data = await conn.send(method, path, orjson.dumps(body) if body is not None else b"")
    assert status < 300, (path, status, data[:300])
    return orjson.loads(data) if data else None


async def open_session(variant: str, port: int, tag: str) -> tuple[int, str, dict[str, str]]:
    """(port, chat-completions path, headers) for one new conversation, as the variant's docs
    set a rollout up; outside the timed calls."""
    conn = await Conn.open(port)
    try:
        if variant == "rowgrove":
            ro = await _json(conn, "POST", "/v1/rollouts", {"group_id": tag})
            from urllib.parse import urlsplit

            return port, urlsplit(ro["base_url"]).path + "/chat/completions", {"Authorization": f"Bearer {ro['api_key']}"}
        if variant == "rllm":
            s = await _json(conn, "POST", "/sessions", {"session_id": tag})
            return port, s["url"] + "/chat/completions", {}
        if variant == "agentlightning":
            await _json(conn, "POST", "/api/rollouts", [{"input": {"task": tag}, "rollout_id": tag}])
            return port, f"/proxy/rollout/{tag}/attempt/a0/mode/train/openai/v1/chat/completions", {}
        if variant == "verifiers":
            s = await _json(conn, "POST", "/_bench/session", {})
            from urllib.parse import urlsplit

            return urlsplit(s["base_url"]).port, "/v1/chat/completions", {"Authorization": f"Bearer {s['key']}"}
        if variant == "nemo-gym":
            return port, "/v1/chat/completions", {}  # the session cookie comes with the first reply
    finally:
        conn.close()
    raise ValueError(variant)


async def peer_conversation(variant: str, port: int, tag: str, server: Server | None = None) -> list[dict[str, Any]]:
    """One conversation of CALLS calls (bench_decide's system prompt, tools and ~600-byte tool
    results; a user message every fifth round); the assistant message is sent back as the
    OpenAI SDK's message (role, content, tool_calls), so every proxy sees the same history. Per
    call: perf_counter interval, end-to-end ms, and with `server` its CPU ms over the call."""
    cport, path, headers = await open_session(variant, port, tag)
    conn = await Conn.open(cport)
    out: list[dict[str, Any]] = []
    msgs: list[dict[str, Any]] = [{"role": "system", "content": bl.bd.SYSTEM},
                                  {"role": "user", "content": "fix the bug in f"}]
    try:
        for k in range(CALLS):
            body = orjson.dumps({"model": MODEL, "messages": msgs, "tools": bl.bd.TOOLS, "max_tokens": 64,
                                 "temperature": 1.0})
            c0 = server.cpu_ns() if server is not None else 0
            t0 = time.perf_counter()
            status, hdrs, data = await conn.send("POST", path, body, headers)
            t1 = time.perf_counter()
            cpu = (server.cpu_ns() - c0) / 1e6 if server is not None else None
            if status != 200:
                log = server_log(variant) + "\n-- upstream:\n" + server_log("upstream")
                raise RuntimeError(f"{variant} call {k + 1}: {status} {data[:800]!r}\n{log}")
            if "set-cookie" in hdrs and "Cookie" not in headers:
                headers = {**headers, "Cookie": hdrs["set-cookie"].split(";")[0]}
            message = orjson.loads(data)["choices"][0]["message"]
            assert message.get("tool_calls"), f"{variant} call {k + 1}: no tool call in {message}"
            out.append({"t0": t0, "t1": t1, "e2e_ms": (t1 - t0) * 1000, "cpu_ms": cpu})
            msgs.append({"role": "assistant", "content": message.get("content"), "tool_calls": message["tool_calls"]})
            msgs.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": f"{k}\n{bl.bd.RESULT}"})
            if k % 5 == 4:
                msgs.append({"role": "user", "content": f"keep going, round {k}"})
    finally:
        conn.close()
    return out


LOGS: dict[str, Path] = {}


def server_log(variant: str) -> str:
    """The tail of a variant's server log (for a failed call's message)."""
    log = LOGS.get(variant)
    return log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""


async def _spans(port: int) -> list[tuple[float, float, str]]:
    conn = await Conn.open(port)
    try:
        _, _, data = await conn.send("GET", "/_bench/spans")
    finally:
        conn.close()
    return [tuple(s) for s in orjson.loads(data)]


def _upstream_ms(calls: list[dict[str, Any]], spans: list[tuple[float, float, str]]) -> None:
    """Each call's upstream time: the spans that start inside its client-side interval (calls
    one after the other), and the routes they were."""
    for c in calls:
        inside = [(a, b, path) for a, b, path in spans if c["t0"] <= a <= c["t1"]]
        c["upstream_ms"] = sum((b - a) * 1000 for a, b, _ in inside)
        c["upstream_routes"] = [path for _, _, path in inside]
        c["added_ms"] = c["e2e_ms"] - c["upstream_ms"]


def measure_variant(variant: str, server: Server, upstream: Server, tag: str, c1_convs: int, c32: int) -> dict[str, Any]:
    """One round of one variant: c=1 (conversations one after the other) then c=32."""
    asyncio.run(_spans(upstream.port))  # drop what came before
    e0 = upstream.cpu_ns()
    calls: list[dict[str, Any]] = []
    for i in range(c1_convs):
        calls += asyncio.run(peer_conversation(variant, server.port, f"{tag}-c1-{i}", server))
    e1 = upstream.cpu_ns()
    _upstream_ms(calls, asyncio.run(_spans(upstream.port)))

    async def burst() -> list[list[dict[str, Any]]]:
        return await asyncio.gather(*(peer_conversation(variant, server.port, f"{tag}-c32-{i}") for i in range(c32)))

    c0, u0, t0 = server.cpu_ns(), upstream.cpu_ns(), time.perf_counter()
    convs = asyncio.run(burst())
    wall = time.perf_counter() - t0
    n = c32 * CALLS
    burst_calls = [c for conv in convs for c in conv]
    return {"c1": {"cpu_ms_per_call": st.median(c["cpu_ms"] for c in calls),
                   "upstream_cpu_ms_per_call": (e1 - e0) / 1e6 / len(calls), "calls": calls},
            "c32": {"cpu_ms_per_call": (server.cpu_ns() - c0) / 1e6 / n,
                    "upstream_cpu_ms_per_call": (upstream.cpu_ns() - u0) / 1e6 / n, "req_per_s": n / wall,
                    "calls": burst_calls}}


# -- the run ----------------------------------------------------------------------------------------


def _r(x: float, nd: int = 3) -> float:
    return round(x, nd)


def _routes(calls: list[dict[str, Any]]) -> dict[str, float]:
    """Upstream requests per call, by route (over the c=1 calls)."""
    count: dict[str, int] = {}
    for c in calls:
        for path in c["upstream_routes"]:
            count[path] = count.get(path, 0) + 1
    return {path: round(n / len(calls), 2) for path, n in sorted(count.items())}


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of the per-round figures; percentiles over all calls."""
    out: dict[str, Any] = {}
    for c in ("c1", "c32"):
        calls = [x for r in rounds for x in r[c]["calls"]]
        row: dict[str, Any] = {
            "cpu_ms_per_call": _r(st.median(r[c]["cpu_ms_per_call"] for r in rounds)),
            "upstream_cpu_ms_per_call": _r(st.median(r[c]["upstream_cpu_ms_per_call"] for r in rounds)),
            "end_to_end_p50_ms": _r(bdp._pct([x["e2e_ms"] for x in calls], 50)),
            "end_to_end_p95_ms": _r(bdp._pct([x["e2e_ms"] for x in calls], 95)),
            "calls": len(calls),
            "rounds_cpu_ms_per_call": [_r(r[c]["cpu_ms_per_call"]) for r in rounds],
        }
        if c == "c1":
            row |= {"added_p50_ms": _r(bdp._pct([x["added_ms"] for x in calls], 50)),
                    "added_p95_ms": _r(bdp._pct([x["added_ms"] for x in calls], 95)),
                    "upstream_p50_ms": _r(bdp._pct([x["upstream_ms"] for x in calls], 50)),
                    "upstream_requests_per_call": _routes(calls),
                    "rounds_added_p50_ms": [_r(bdp._pct([x["added_ms"] for x in r[c]["calls"]], 50)) for r in rounds]}
        else:
            row |= {"req_per_s": round(st.median(r[c]["req_per_s"] for r in rounds)),
                    "rounds_req_per_s": [round(r[c]["req_per_s"]) for r in rounds]}
        out[c] = row
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="one round, fewer conversations (writes nothing)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {','.join(PEERS)}")
    ap.add_argument("--venvs", default=os.environ.get("ROWGROVE_PEERS", "/work/peers"))
    ap.add_argument("--long-calls", type=int, default=200,
                    help="then one long conversation of this many calls on the deployed path (0: none)")
    ap.add_argument("--long-conversations", type=int, default=3, help="long conversations measured (median per call)")
    ap.add_argument("--out", default=None, help=f"default {RESULTS.relative_to(ROOT)}")
    ap.add_argument("--serve-upstream", nargs=2, metavar=("PORT", "FOLDER"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_upstream:
        serve_upstream(int(args.serve_upstream[0]), args.serve_upstream[1])
        return {}
    if (why := bdp.qwen3_absent()) is not None:  # one line, not an exit: `rowgrove bench` runs every file
        print(f"bench_peers: not run: {why}", flush=True)
        return {}
    venvs = Path(args.venvs)
    chosen = [p.strip() for p in args.peers.split(",") if p.strip()]
    if unknown := [p for p in chosen if p not in PEERS]:
        raise SystemExit(f"unknown peers {unknown}; known: {', '.join(PEERS)}")
    rounds, c1_convs, c32 = (1, 2, 8) if args.quick else (args.rounds, 4, 32)
    load_start = os.getloadavg()
    available: list[Peer] = []
    skipped: dict[str, str] = {}
    for name in chosen:
        peer = PEERS[name]
        if not (venvs / name / "bin" / "python").exists():
            skipped[name] = install_line(peer, venvs)
            print(f"{name}: no venv at {venvs / name}; install it with: {skipped[name]}", flush=True)
        else:
            available.append(peer)
    if not available:  # the point is the side by side: rowgrove alone is bench_gateway's and bench_deployed's
        print(f"bench_peers: no peer installed under {venvs} (see the install lines above): nothing measured, "
              "nothing written", flush=True)
        return {}
    versions = {p.name: peer_version(venvs / p.name / "bin" / "python", p.package) for p in available}

    from families import family_model_dir

    folder = str(family_model_dir("qwen3", vocab="real"))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryDirectory(prefix="rowgrove-bench-peers-") as tmp:
        tmpd = Path(tmp)
        servers: dict[str, Server] = {}
        rec: dict[str, list[dict[str, Any]]] = {}
        floor: dict[str, list] = {"c1": [], "c32": []}
        null = bg.Server("gateway", f"{tmp}/null.db")
        try:
            upstream = Server([sys.executable, __file__, "--serve-upstream", "{port}", folder], "/health",
                              dict(env, PYTHONPATH=str(ROOT / "src")), tmpd / "upstream.log")
            up_url = f"http://127.0.0.1:{upstream.port}"
            servers["rowgrove"] = Server(
                [sys.executable, "-m", "rowgrove", "serve", "--engine", "vllm", "--engine-url", up_url, "--model", folder,
                 "--served-model-name", MODEL, "--ledger", f"{tmp}/loop-rowgrove.db", "--port", "{port}",
                 "--max-body-bytes", str(64 << 20), "--log-level", "warning"],
                "/health", dict(env, PYTHONPATH=str(ROOT / "src")), tmpd / "rowgrove.log")
            for p in available:
                script = tmpd / f"launch_{p.name.replace('-', '_')}.py"
                script.write_text(p.launcher)
                peer_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
                try:
                    servers[p.name] = Server([str(venvs / p.name / "bin" / "python"), str(script), "{port}", up_url,
                                              tmp, folder, MODEL], p.ready, peer_env, tmpd / f"{p.name}.log")
                except RuntimeError as e:  # a broken install: say so, measure the rest
                    skipped[p.name] = f"did not start: {str(e)[-500:]}"
                    print(f"{p.name}: {skipped[p.name]}", flush=True)
            if "agentlightning" in servers:
                conn_port = servers["agentlightning"].port
                asyncio.run(_register_agl(conn_port, up_url))
            for name, s in servers.items():
                asyncio.run(peer_conversation(name, s.port, f"warm-{name}"))
                s.adopt_children()
                rec[name] = []
            asyncio.run(bg.drive(null.port, 4, 4, 2))  # the floor's warm-up, as bench_gateway's
            names = list(servers)

            round_loads: list[float] = []

            def one_round(r: int) -> None:
                round_loads.append(round(os.getloadavg()[0], 2))
                for c, convs, conc in (("c1", c1_convs, 1), ("c32", c32, c32)):  # bench_gateway's null_round
                    n0 = bl.cpu_ns(null.proc.pid)
                    res = asyncio.run(bg.drive(null.port, convs, conc, CALLS))
                    floor[c].append(((bl.cpu_ns(null.proc.pid) - n0) / 1e6 / res["requests"],
                                     res["requests"] / res["wall_s"], [ms for _, ms in res["srv"]]))
                order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
                for name in order:
                    res = measure_variant(name, servers[name], upstream, f"{name}-{r}", c1_convs, c32)
                    rec[name].append(res)
                    print(f"round {r + 1} {name:15s} c=1 CPU {res['c1']['cpu_ms_per_call']:.2f} ms/call, "
                          f"c=32 {res['c32']['req_per_s']:.0f} req/s, CPU {res['c32']['cpu_ms_per_call']:.2f} ms/call; "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)

            deployed = bdp.measure({"rowgrove": None}, tmp, rounds, c1_convs, c32, extra=one_round)["rowgrove"]
            long_run = long_conversation(tmpd, min(40, args.long_calls) if args.quick else args.long_calls,
                                         1 if args.quick else args.long_conversations)
            calls_made = CALLS * (1 + rounds * (c1_convs + c32))
            stored = {name: _stored_bytes(tmpd, name) for name in servers}
            rss = {name: _rss_mb(s.pids) for name, s in servers.items()}
            procs = {name: len(s.pids) for name, s in servers.items()}
        finally:
            for s in servers.values():
                s.close()
            if "upstream" in locals():
                upstream.close()
            null.close()
    load_end = os.getloadavg()
    result: dict[str, Any] = {
        "command": " ".join(["bench/bench_peers.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_avg_start": [round(x, 2) for x in load_start], "load_avg_end": [round(x, 2) for x in load_end],
                    "load_avg_1min_each_round": round_loads},
        "rounds": rounds, "calls_per_conversation": CALLS,
        "conversations": {"c1": f"{c1_convs} one after the other", "c32": f"{c32} at once"},
        "upstream": "this file's vLLM-shaped upstream on tiny Qwen3 with Qwen3's real tokenizer (instant, one tool call)",
        "versions": versions, "skipped": skipped,
        "rowgrove_null_engine": {c: {
            "cpu_ms_per_call": _r(st.median(x[0] for x in floor[c])),
            **({"req_per_s": round(st.median(x[1] for x in floor[c]))} if c == "c32" else {}),
            "server_p50_ms": _r(bdp._pct([m for x in floor[c] for m in x[2]], 50)),
            "server_p95_ms": _r(bdp._pct([m for x in floor[c] for m in x[2]], 95)),
            "rounds_cpu_ms_per_call": [_r(x[0]) for x in floor[c]]} for c in ("c1", "c32")},
        "rowgrove_deployed_measure": deployed,
        "rowgrove_long_conversation": long_run,
        "variants": {name: {**summarize(rs), "stored_bytes_per_call": None if stored[name] is None else
                            round(stored[name] / calls_made), "rss_mb_at_end": rss[name],
                            "processes_counted": procs[name]} for name, rs in rec.items()},
        "calls_per_variant": calls_made,
        "quick": args.quick,
    }
    result["goals"] = goals_of(result)
    if not args.quick:
        out = Path(args.out) if args.out else RESULTS
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    print("\n".join(table(result)))
    return result


def goals_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue #37's goals for the deployed path, read off this run (`rowgrove bench` prints each
    MET or MISSED): CPU per call at c=32 and c=1, the added p50 at c=1 against NeMo Gym's in the
    same run (the upstream's own time taken out of both), call 200 against call 10."""
    d = result["rowgrove_deployed_measure"]
    out: dict[str, dict[str, Any]] = {
        "deployed_cpu_ms_per_call_c32": {"value": d["c32"]["gateway_cpu_ms_per_call"], "goal": "<= 0.6",
                                         "met": d["c32"]["gateway_cpu_ms_per_call"] <= 0.6},
        "deployed_cpu_ms_per_call_c1": {"value": d["c1"]["gateway_cpu_ms_per_call"], "goal": "<= 0.9",
                                        "met": d["c1"]["gateway_cpu_ms_per_call"] <= 0.9},
    }
    nemo = result["variants"].get("nemo-gym")
    if nemo is not None:
        out["deployed_added_p50_ms_c1"] = {"value": d["c1"]["added_p50_ms"],
                                           "goal": f"<= NeMo Gym's {nemo['c1']['added_p50_ms']}",
                                           "met": d["c1"]["added_p50_ms"] <= nemo["c1"]["added_p50_ms"]}
    long = result.get("rowgrove_long_conversation")
    if long is not None and long["calls"] >= 200:
        out["long_call_200_over_call_10_cpu"] = {"value": long["cpu_ratio_last_vs_call_10"], "goal": "<= 2",
                                                 "met": long["cpu_ratio_last_vs_call_10"] <= 2}
    return out


def long_conversation(tmp: Path, calls: int, conversations: int) -> dict[str, Any] | None:
    """The deployed path along one long conversation, in the same run as the rounds:
    bench_long_conversation's `one_run` (a fresh `rowgrove serve --engine vllm` of this tree in
    front of its instant stand-in, tiny Qwen3 on Qwen3's real tokenizer, `calls` calls per
    conversation, `conversations` measured, the median per call) and its `summary`: the gateway's
    CPU per call at calls 196-200 against calls 8-12 and call 1. None with `calls` 0."""
    if calls <= 0:
        return None
    folder = bl.long_model(tmp / "long", "qwen3")
    port = bl._free_port()
    engine = bl.Proc([sys.executable, bl.__file__, "--serve-engine", str(port), folder], port, bl._env(None))
    try:
        s = bl.summary(bl.one_run(str(ROOT / "src"), folder, engine, str(tmp / "long.db"), calls, conversations))
    finally:
        engine.close()
    print(f"long conversation ({calls} calls, {s['prompt_tokens_last']} prompt tokens at the last): CPU ms call 1 "
          f"{s['cpu_ms_call_1']:.2f}, calls 8-12 {s['cpu_ms_call_10']:.2f}, last 5 {s['cpu_ms_last_5']:.2f}: "
          f"{s['cpu_ratio_last_vs_call_10']:.2f}x calls 8-12", flush=True)
    return {"calls": calls, "conversations": conversations, **s}


LABELS = {"rowgrove": "rowgrove `--engine vllm` (this loop)", "rllm": "rllm-model-gateway", "agentlightning":
          "agent-lightning LLM proxy", "nemo-gym": "NeMo Gym vllm_model", "verifiers": "verifiers interception"}


def table(result: dict[str, Any]) -> list[str]:
    """The docs' table: per variant c=1 added p50 / p95 ms, CPU ms/call c=1, req/s c=32, CPU
    ms/call c=32, and the upstream's CPU ms/call at c=1 / c=32."""
    rows = ["| | c=1 added p50 / p95 ms | CPU ms/call c=1 | c=32 req/s | CPU ms/call c=32 | upstream CPU ms/call c=1 / c=32 |",
            "|---|---|---|---|---|---|"]
    n = result["rowgrove_null_engine"]
    rows.append(f"| rowgrove null engine (Server-Timing) | {n['c1']['server_p50_ms']:.2f} / {n['c1']['server_p95_ms']:.2f} | "
                f"{n['c1']['cpu_ms_per_call']:.2f} | {n['c32']['req_per_s']} | {n['c32']['cpu_ms_per_call']:.2f} | - |")
    d = result["rowgrove_deployed_measure"]
    rows.append(f"| rowgrove `--engine vllm`, bench_deployed.measure (Server-Timing − stand-in) | "
                f"{d['c1']['added_p50_ms']:.2f} / {d['c1']['added_p95_ms']:.2f} | {d['c1']['gateway_cpu_ms_per_call']:.2f} | "
                f"{d['c32']['req_per_s']} | {d['c32']['gateway_cpu_ms_per_call']:.2f} | "
                f"{d['c1']['standin_cpu_ms_per_call']:.2f} / {d['c32']['standin_cpu_ms_per_call']:.2f} |")
    for name, v in result["variants"].items():
        rows.append(f"| {LABELS.get(name, name)} | {v['c1']['added_p50_ms']:.2f} / {v['c1']['added_p95_ms']:.2f} | "
                    f"{v['c1']['cpu_ms_per_call']:.2f} | {v['c32']['req_per_s']} | {v['c32']['cpu_ms_per_call']:.2f} | "
                    f"{v['c1']['upstream_cpu_ms_per_call']:.2f} / {v['c32']['upstream_cpu_ms_per_call']:.2f} |")
    return rows


def _rss_mb(pids: list[int]) -> float:
    """Resident memory (MB) of the processes, summed, at the end of the run."""
    total = 0
    for pid in pids:
        try:
            line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
            total += int(line.split()[1])
        except (OSError, StopIteration):
            pass
    return round(total / 1024, 1)


def _stored_bytes(tmp: Path, name: str) -> int | None:
    """Bytes on disk of the variant's own store (its SQLite file and journals); None: it keeps
    no file (memory only, or nothing)."""
    files = list(tmp.glob(f"loop-{name}.db*"))
    return sum(f.stat().st_size for f in files) if files else None


async def _register_agl(port: int, up_url: str) -> None:
    """agentlightning: the model server registered once (POST /api/models), as its trainer does."""
    conn = await Conn.open(port)
    try:
        await _json(conn, "POST", "/api/models", [{"model": MODEL, "endpoint": up_url + "/v1"}])
    finally:
        conn.close()


if __name__ == "__main__":
    main()
