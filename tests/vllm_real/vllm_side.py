"""Run by vLLM's own python (.venv-vllm): vLLM's chat rendering and vLLM's tool-call and reasoning
parsers, offline, through the code paths its server uses, for the real-vLLM tests to compare
rowgrove with. Reads one JSON job from stdin, writes one JSON answer to stdout.

    {"render": [{"model": FOLDER, "messages": [...], "tools": [...]|null, "kwargs": {...}}, ...],
     "parse":  [{"model": FOLDER, "tool_parser": NAME|null, "reasoning_parser": NAME|null,
                 "ids": [sampled ids, stop token excluded], "tools": [...]|null, "kwargs": {...},
                 "harmony": bool (gpt-oss: the server's HarmonyParser, as for model_type gpt_oss)}, ...]}
    -> {"render": [{"ids": [...]} | {"error": "..."}], "parse": [{"reasoning", "content",
        "tool_calls": [{"name", "arguments"}], "text"} | {"error": "..."}]}

Rendering is the `/tokenize` route with `messages` (vllm/entrypoints/serve/tokenize/serving.py:
`OnlineRenderer.preprocess_chat` with a `TokenizeChatRequest`), which is the chat-completions
route's own preprocessing (vllm/renderers/online_renderer.py, "Copied from
GenerateBaseServing._preprocess_chat"). Parsing is the chat-completions route's non-streaming
path (vllm/entrypoints/openai/chat_completion/serving.py, chat_completion_full_generator):
`ParserManager.get_parser(...)` composed from the named parsers, `adjust_request` as
preprocess_chat applies it (it may turn off skip_special_tokens, as the mistral parser does), the
sampled ids detokenized as the request's `skip_special_tokens` says, then `parser.parse(text,
request, enable_auto_tools=True, model_output_token_ids=ids)`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any


def _configs() -> Any:
    from vllm.engine.arg_utils import EngineArgs

    cache: dict[str, Any] = {}

    def get(folder: str) -> Any:
        if folder not in cache:
            cache[folder] = EngineArgs(model=folder, dtype="float32", enforce_eager=True,
                                       max_model_len=4096).create_engine_config()
        return cache[folder]

    return get


def render(job: dict[str, Any], config: Any, renderers: dict[str, Any]) -> list[int]:
    from vllm.entrypoints.serve.tokenize.protocol import TokenizeChatRequest
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.renderers.registry import renderer_from_config

    folder = job["model"]
    if folder not in renderers:
        renderers[folder] = OnlineRenderer(config.model_config, renderer_from_config(config), request_logger=None,
                                           chat_template=None, chat_template_content_format="auto")
    online = renderers[folder]
    req = TokenizeChatRequest(model=folder, messages=job["messages"], tools=job.get("tools"),
                              add_generation_prompt=True, chat_template_kwargs=job.get("kwargs") or None)
    tool_dicts = None if req.tools is None else [t.model_dump() for t in req.tools]
    _, (engine_input,) = asyncio.run(online.preprocess_chat(
        req, req.messages, default_template=None, default_template_content_format="auto",
        default_template_kwargs=None, tool_dicts=tool_dicts, skip_mm_cache=True))
    return list(engine_input["prompt_token_ids"])


def parse(job: dict[str, Any], config: Any, renderers: dict[str, Any]) -> dict[str, Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.renderers.registry import renderer_from_config

    folder = job["model"]
    if folder not in renderers:
        renderers[folder] = OnlineRenderer(config.model_config, renderer_from_config(config), request_logger=None,
                                           chat_template=None, chat_template_content_format="auto")
    tokenizer = renderers[folder].renderer.get_tokenizer()
    parser_cls = ParserManager.get_parser(tool_parser_name=job.get("tool_parser"),
                                          reasoning_parser_name=job.get("reasoning_parser"),
                                          enable_auto_tools=True, model_name=folder, tokenizer=tokenizer,
                                          is_harmony=bool(job.get("harmony")))
    request = ChatCompletionRequest(model=folder, messages=[{"role": "user", "content": "hi"}],
                                    tools=job.get("tools"), chat_template_kwargs=job.get("kwargs") or None)
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=job.get("kwargs") or {},
                        model_config=config.model_config)
    request = parser.adjust_request(request=request)
    text = tokenizer.decode(job["ids"], skip_special_tokens=request.skip_special_tokens)
    reasoning, content, tool_calls = parser.parse(text, request, enable_auto_tools=True,
                                                  model_output_token_ids=job["ids"])
    calls = []
    for tc in tool_calls or []:
        fn = getattr(tc, "function", tc)  # FunctionCall (name, arguments) or a ToolCall around one
        calls.append({"name": fn.name, "arguments": json.loads(fn.arguments or "{}")})
    return {"reasoning": reasoning, "content": content, "tool_calls": calls, "text": text}


def main() -> None:
    job = json.load(sys.stdin)
    get = _configs()
    renderers: dict[str, Any] = {}
    out: dict[str, list[Any]] = {"render": [], "parse": []}
    for item in job.get("render", []):
        try:
            out["render"].append({"ids": render(item, get(item["model"]), renderers)})
        except Exception as e:  # noqa: BLE001 - reported per item, the test names it
            out["render"].append({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]})
    for item in job.get("parse", []):
        try:
            out["parse"].append(parse(item, get(item["model"]), renderers))
        except Exception as e:  # noqa: BLE001
            out["parse"].append({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]})
    sys.stdout.write("\nVLLM_SIDE_JSON " + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
