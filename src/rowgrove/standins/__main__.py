"""Run a stand-in server in the foreground, for trying rowgrove's server engines without a GPU:

    python -m rowgrove.standins vllm --model tiny --port 8001
    python -m rowgrove.standins sglang --model tiny --port 30000 --incremental
    rowgrove serve --engine vllm --engine-url http://127.0.0.1:8001 --model tiny ...

The stand-in samples real tokens with the hf engine on `--model` (a tiny spec or a Hugging Face
model folder) and speaks the server's wire format (see rowgrove.standins.vllm / .sglang). Faults
can be armed while it runs: `curl -X POST HOST/_standin/fault -d '{"mode": "503", "count": 2}'`;
`GET /_standin/log` shows what it saw.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rowgrove.errors import RowgroveError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rowgrove.standins",
                                description="Run a vLLM or SGLang stand-in server (real tokens from a small model).")
    p.add_argument("kind", choices=("vllm", "sglang"), help="which server to stand in for")
    p.add_argument("--model", default="tiny", help="tiny spec (tiny, tiny-qwen3, tiny-llama3) or HF model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the model name the server reports (default --model)")
    p.add_argument("--max-model-len", type=int, default=4096, help="context length in tokens")
    p.add_argument("--segment", type=int, default=4, help="tokens sampled per piece (stream granularity)")
    p.add_argument("--incremental", action="store_true",
                   help="sglang only: stream increments (as with --incremental-streaming-output)")
    p.add_argument("--no-dev-routes", action="store_true",
                   help="vllm only: serve without the dev routes (as without VLLM_SERVER_DEV_MODE=1)")
    p.add_argument("--max-batch", type=int, default=16, help="most requests the hf engine decodes together")
    p.add_argument("--device", default="cpu")
    return p


def make_app(args: argparse.Namespace) -> tuple[Any, Any]:
    """(app, engine) for the parsed arguments."""
    from rowgrove.engines import make_engine
    from rowgrove.standins.common import StandinState

    if args.kind == "vllm" and args.incremental:
        raise RowgroveError("--incremental is an sglang option: vLLM always streams increments")
    if args.kind == "sglang" and args.no_dev_routes:
        raise RowgroveError("--no-dev-routes is a vllm option: SGLang serves its weight routes always")
    if args.kind == "sglang" and args.max_model_len != 4096:
        raise RowgroveError("--max-model-len is a vllm option here: the SGLang stand-in takes no context length")
    engine = make_engine("hf", args.model, device=args.device, max_batch=args.max_batch)
    state = StandinState()
    if args.kind == "vllm":
        from rowgrove.standins.vllm import create_app

        app = create_app(engine, args.model, state, served_model_name=args.served_model_name,
                         max_model_len=args.max_model_len, dev_mode=not args.no_dev_routes, segment=args.segment)
    else:
        from rowgrove.standins.sglang import create_app

        options: dict[str, Any] = {"incremental": args.incremental, "segment": args.segment}
        if args.served_model_name is not None:
            options["served_model_name"] = args.served_model_name
        app = create_app(engine, args.model, state, **options)
    return app, engine


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        app, _engine = make_app(args)
    except RowgroveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    print(f"{args.kind} stand-in over {args.model} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
