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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny",
                   help="tiny | tiny-qwen3 | tiny-llama3 | path to a Hugging Face model directory")
    p.add_argument("--engine", default="scripted", choices=("hf", "scripted", "vllm", "sglang"),
                   help="hf: local transformers generation; scripted: deterministic replies (tests, demos); "
                        "vllm, sglang: a running server at --engine-url that serves --model")
    p.add_argument("--engine-url", action="append", default=[], metavar="URL",
                   help="address of the vllm/sglang server (repeat it, or comma-separate, for several: a "
                        "rollout's calls stay on one server)")
    p.add_argument("--engine-api-key", default=os.environ.get("ROWGROVE_ENGINE_API_KEY"),
                   help="API key the vllm/sglang server wants (default: $ROWGROVE_ENGINE_API_KEY)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name the vllm server was started with (default: the one model it serves)")
    p.add_argument("--ledger", required=True, help="SQLite ledger file (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
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
    )
    if args.engine in ("vllm", "sglang"):
        if not args.engine_url:
            raise InputError(f"--engine {args.engine} needs --engine-url, the address of the server")
        engine = make_engine(args.engine, args.model, url=args.engine_url, timeout=args.engine_timeout,
                             api_key=args.engine_api_key, served_model=args.served_model_name)
    else:
        if args.engine_url:
            raise InputError(f"--engine-url is for --engine vllm or sglang, not {args.engine}")
        engine = make_engine(args.engine, args.model, device=args.device)
    _say_model_format(engine.tokenizer, settings)
    ledger = Ledger(args.ledger)
    try:
        serve(engine, ledger, host=args.host, port=args.port, settings=settings, log_level=args.log_level)
    finally:
        asyncio.run(engine.aclose())
        ledger.close()
    return 0


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
