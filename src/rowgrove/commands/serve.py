"""`rowgrove serve`: the capture gateway in front of an engine, recording into a ledger.

    rowgrove serve --model tiny --engine scripted --ledger runs/ledger.db
    rowgrove serve --model /models/Qwen3-0.6B --engine hf --ledger runs/ledger.db --device cuda
    rowgrove serve --model /models/Qwen3-8B --engine vllm --engine-url http://gpu1:8001,http://gpu2:8001 --ledger runs/ledger.db

Binds 127.0.0.1 unless --host says otherwise; control routes are open to loopback callers
unless --admin-key is given. Calls a crash left pending are marked aborted on start; rollouts,
their keys and their calls survive a restart on the same ledger.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny",
                   help="tiny | tiny-qwen3 | tiny-llama3 | tiny-vl (vision) | path to a Hugging Face model directory")
    p.add_argument("--engine", default="scripted", choices=("hf", "scripted", "vllm", "sglang"),
                   help="hf: local transformers generation; scripted: deterministic replies (tests, demos); "
                        "vllm, sglang: a running server at --engine-url that serves --model")
    p.add_argument("--script", choices=("harness",),
                   help="scripted engine only: harness picks each reply from the prompt (a call to the harness's "
                        "shell tool, a final answer, a summary when asked to compact), to drive real coding agents")
    p.add_argument("--engine-url", action="append", default=[], metavar="URL",
                   help="address of the vllm/sglang server (repeat it, or comma-separate, for several: a "
                        "rollout's calls stay on one server)")
    p.add_argument("--engine-api-key", default=os.environ.get("ROWGROVE_ENGINE_API_KEY"),
                   help="API key the vllm/sglang server wants (default: $ROWGROVE_ENGINE_API_KEY)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name the vllm server was started with (default: the one model it serves)")
    p.add_argument("--ledger", required=True, help="SQLite ledger file (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_number, default=8000, help="port to bind (default 8000)")
    p.add_argument("--admin-key", default=os.environ.get("ROWGROVE_ADMIN_KEY"),
                   help="key the control routes require (default: $ROWGROVE_ADMIN_KEY; none = loopback only)")
    p.add_argument("--max-body-bytes", type=int, default=32 << 20, help="largest request body (default 32 MiB)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="most generations in flight; more get 429 with Retry-After (default 256)")
    p.add_argument("--engine-timeout", type=float, default=600.0,
                   help="seconds one generation may take before 504 (default 600)")
    p.add_argument("--max-tokens", type=int, default=1024,
                   help="max_tokens for requests that name none (default 1024)")
    p.add_argument("--tool-parser", default=None,
                   help="how sampled tool calls are read, by vLLM's names: hermes, llama3_json, mistral, "
                        "qwen3_coder, deepseek_v31, deepseek_v3, openai, glm45, kimi_k2, none "
                        "(default: detected from the chat template)")
    p.add_argument("--reasoning-parser", default=None,
                   help="how sampled reasoning is split off: qwen3, deepseek_r1, deepseek_v3, openai, glm45, "
                        "kimi_k2, mistral, none (default: detected from the chat template)")
    p.add_argument("--device", default="cpu", help="torch device of the engine (cpu, cuda, cuda:1, ...)")
    p.add_argument("--max-json-depth", type=int, default=64,
                   help="request JSON nested deeper than this gets 400 (default 64, at most 200)")
    p.add_argument("--body-timeout", type=float, default=30.0,
                   help="seconds a request's headers, and then its body, may take to arrive; slower gets 408 "
                        "(default 30)")
    p.add_argument("--max-open-uploads", type=int, default=256,
                   help="most requests whose body is still arriving; more get 503 (default 256)")
    p.add_argument("--public-url", default=None, metavar="URL",
                   help="the address harnesses reach the gateway at, the base of every base_url "
                        "(default http://HOST:PORT as bound; never taken from request headers)")
    p.add_argument("--trusted-proxy", action="append", default=[], metavar="ADDR",
                   help="a reverse proxy (address or network) whose X-Forwarded-For is believed for "
                        "loopback trust of the control routes; repeat for several (default: none)")
    p.add_argument("--durability", default="normal", choices=("normal", "full"),
                   help="ledger commits: normal survives a process crash, full also a power loss "
                        "(SQLite synchronous=FULL, slower) (default normal)")
    p.add_argument("--hosted-tools", default="drop", choices=("drop", "refuse"),
                   help="hosted tools the engine cannot run (Responses web_search, file_search, ...; Anthropic "
                        "server tools): drop (default) leaves them out of the prompt, refuse answers 400 naming the tool")
    p.add_argument("--media-folder", default=None, metavar="DIR",
                   help="let image parts name local files (file:///...) inside DIR; vision models only "
                        "(default: file URLs are refused, send images as data: URLs)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def run(args: argparse.Namespace) -> int:
    import asyncio

    from rowgrove.engines import make_engine
    from rowgrove.errors import InputError
    from rowgrove.gateway.server import serve
    from rowgrove.gateway.sessions import GatewaySettings
    from rowgrove.ledger import Ledger

    if args.max_body_bytes < 1024:
        raise InputError(f"--max-body-bytes {args.max_body_bytes} is too small: give at least 1024")
    if args.max_queue < 1:
        raise InputError(f"--max-queue must be at least 1, got {args.max_queue}")
    settings = GatewaySettings(
        admin_key=args.admin_key or None, max_body_bytes=args.max_body_bytes, max_queue=args.max_queue,
        engine_timeout=args.engine_timeout, default_max_tokens=args.max_tokens,
        tool_parser=args.tool_parser, reasoning_parser=args.reasoning_parser,
        max_json_depth=args.max_json_depth, body_timeout=args.body_timeout, max_open_uploads=args.max_open_uploads,
        public_url=args.public_url, trusted_proxies=tuple(args.trusted_proxy),
        model_name=args.served_model_name or args.model, media_folder=_media_folder(args.media_folder),
        hosted_tools=args.hosted_tools,
    )
    if args.engine in ("vllm", "sglang") and not args.engine_url:
        raise InputError(f"--engine {args.engine} needs --engine-url, the address of the server")
    if args.engine not in ("vllm", "sglang") and args.engine_url:
        raise InputError(f"--engine-url is for --engine vllm or sglang, not {args.engine}")
    # before anything is created or loaded: a busy port and a bad ledger fail at once, and a
    # start-up that fails later removes the ledger file this start created (if it holds nothing)
    check_port_free(args.host, args.port)
    created = paths_to_create(Path(args.ledger))
    ledger = Ledger(args.ledger, durability=args.durability)
    engine, failed = None, True
    try:
        if args.engine in ("vllm", "sglang"):
            engine = make_engine(args.engine, args.model, url=args.engine_url, timeout=args.engine_timeout,
                                 api_key=args.engine_api_key, served_model=args.served_model_name)
        else:
            extra = {"policy": args.script} if args.script else {}
            if args.script and args.engine != "scripted":
                raise InputError(f"--script is for --engine scripted, not {args.engine}")
            engine = make_engine(args.engine, args.model, device=args.device, **extra)
        _say_model_format(engine.tokenizer, settings)
        try:
            serve(engine, ledger, host=args.host, port=args.port, settings=settings, log_level=args.log_level)
        except KeyboardInterrupt:
            failed = False  # the usual way to stop a server in a terminal
            raise
        except SystemExit as e:  # uvicorn exits when it cannot bind (the port was taken since the check)
            if e.code:
                raise InputError(f"the gateway did not start on {args.host}:{args.port} (the line above says "
                                 "why): stop the other server or pass --port") from None
            raise
        failed = False
    finally:
        if engine is not None:
            asyncio.run(engine.aclose())
        close_and_clean(ledger, created if failed else [])
    return 0


def port_number(text: str) -> int:
    """argparse type of --port: an integer in 0..65535 (0: the system picks a free port)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give one in 0..65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is out of range: give a port in 0..65535")
    return port


def check_port_free(host: str, port: int) -> None:
    """InputError unless every address `host` names can bind `port` now, as uvicorn will bind it
    (SO_REUSEADDR; IPv6 sockets IPv6-only, as asyncio's create_server makes them)."""
    import errno
    import socket

    from rowgrove.errors import InputError

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(f"--host {host!r} is not an address of this machine ({e.strerror}): "
                         "pass e.g. 127.0.0.1 or 0.0.0.0") from None
    for family, kind, proto, _, addr in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise InputError(f"port {port} on {host} is in use: stop the other server or pass --port") from None
                if e.errno == errno.EACCES:
                    raise InputError(f"port {port} on {host} needs privileges to bind: pass --port above 1023") from None
                raise InputError(f"cannot bind {host}:{port} ({e.strerror}): pass another --host or --port") from None


def paths_to_create(ledger: Path) -> list[Path]:
    """The ledger file, its SQLite side files and the folders above it that opening it would
    create; none for a file that exists (its side files may belong to another open connection)."""
    if ledger.exists():
        return []
    out = [p for p in (ledger, Path(f"{ledger}-wal"), Path(f"{ledger}-shm")) if not p.exists()]
    parent = ledger.parent
    while not parent.exists():
        out.append(parent)
        parent = parent.parent
    return out


def close_and_clean(ledger, created: list[Path]) -> None:
    """Close the ledger; then remove `created` (files first, then folders, innermost first) if the
    ledger holds no rollout: a start-up that failed leaves no file behind, and never drops data."""
    try:
        empty = ledger.count() == 0
    except Exception:  # noqa: BLE001 - a ledger that cannot even be counted is kept as it is
        empty = False
    ledger.close()
    if not (empty and created):
        return
    for path in created:
        try:
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass


def _say_model_format(tokenizer, settings) -> None:
    """One start-up line: which parsers serve this model and which tokens stop its turns."""
    import sys

    from rowgrove.gateway.sessions import choose_parsers
    from rowgrove.model.load import stop_token_ids

    tool, reasoning = choose_parsers(tokenizer.chat_template, settings)
    how = {None: "detected from the chat template", "none": "off"}
    stops = ", ".join(tokenizer.convert_ids_to_tokens(stop_token_ids(tokenizer)))
    print(f"rowgrove: tool parser {tool or 'none'} ({how.get(settings.tool_parser, 'given')}), "
          f"reasoning parser {reasoning or 'none'} ({how.get(settings.reasoning_parser, 'given')}), "
          f"stop tokens {stops}", file=sys.stderr, flush=True)


def _media_folder(folder: str | None) -> str | None:
    """The --media-folder as an absolute path; InputError when it is not a directory."""
    from rowgrove.errors import InputError

    if folder is None:
        return None
    path = Path(folder).expanduser()
    if not path.is_dir():
        raise InputError(f"--media-folder {folder} is not a directory: pass the folder your harness saves images in")
    return str(path.resolve())
