"""Run by vLLM's own python (.venv-stack-vllm): vLLM's chat rendering and vLLM's tool-call and reasoning
parsers, offline, through the code paths its server uses, for the real-vLLM tests to compare
rowgrove with. Reads one JSON job from stdin, writes one JSON answer to stdout.

    {"render": [{"model": FOLDER, "messages": [...], "tools": [...]|null, "kwargs": {...}}, ...],
     "parse":  [{"model": FOLDER, "tool_parser": NAME|null, "reasoning_parser": NAME|null,
                 "ids": [sampled ids, stop token excluded], "tools": [...]|null, "kwargs": {...},
                 "harmony": bool (gpt-oss: the server's HarmonyParser, as for model_type gpt_oss),
                 "prompt_ids": [the generation prompt's ids, for the streamed parse]}, ...]}
    -> {"render": [{"ids": [...]} | {"error": "..."}], "parse": [{"reasoning", "content",
        "tool_calls": [{"name", "arguments"}], "text", "streamed": {"reasoning", "content",
        "tool_calls"} | {"error": "..."}} | {"error": "..."}]}

Rendering is the `/tokenize` route with `messages` (vllm/entrypoints/serve/tokenize/serving.py:
`OnlineRenderer.preprocess_chat` with a `TokenizeChatRequest`), which is the chat-completions
route's own preprocessing (vllm/renderers/online_renderer.py, "Copied from
GenerateBaseServing._preprocess_chat"). Parsing is the chat-completions route's non-streaming
path (vllm/entrypoints/openai/chat_completion/serving.py, chat_completion_full_generator):
`ParserManager.get_parser(...)` composed from the named parsers, `adjust_request` as
preprocess_chat applies it (it may turn off skip_special_tokens, as the mistral parser does), the
sampled ids detokenized as the request's `skip_special_tokens` says, then `parser.parse(text,
request, enable_auto_tools=True, model_output_token_ids=ids)`. The streamed parse is the same
route's streaming path (chat_completion_stream_generator): a fresh parser fed one sampled id at a
time through `parser.parse_delta(delta_text, delta_token_ids, request, prompt_token_ids,
finished=...)`, the delta text held back while it ends inside a UTF-8 character (as the
incremental detokenizer does), and the deltas summed: reasoning and content concatenated, each
tool call's name and argument pieces joined by index.

gpt-oss (harmony) loads the o200k encoding through openai_harmony: the caller points
TIKTOKEN_ENCODINGS_BASE at a folder holding `o200k_base.tiktoken` (written offline from the
gpt-oss tokenizer.json, see real_vllm.write_o200k), so nothing is downloaded.
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


def _parser(job: dict[str, Any], config: Any, renderers: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(tokenizer, a fresh parser, its adjusted request) for one parse job."""
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
                                    tools=job.get("tools"), chat_template_kwargs=job.get("kwargs") or None,
                                    stream=bool(job.get("stream")))
    parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=job.get("kwargs") or {},
                        model_config=config.model_config)
    return tokenizer, parser, parser.adjust_request(request=request)


def parse(job: dict[str, Any], config: Any, renderers: dict[str, Any]) -> dict[str, Any]:
    tokenizer, parser, request = _parser(job, config, renderers)
    text = tokenizer.decode(job["ids"], skip_special_tokens=request.skip_special_tokens)
    reasoning, content, tool_calls = parser.parse(text, request, enable_auto_tools=True,
                                                  model_output_token_ids=job["ids"])
    calls = []
    for tc in tool_calls or []:
        fn = getattr(tc, "function", tc)  # FunctionCall (name, arguments) or a ToolCall around one
        calls.append({"name": fn.name, "arguments": json.loads(fn.arguments or "{}")})
    out = {"reasoning": reasoning, "content": content, "tool_calls": calls, "text": text}
    if job.get("prompt_ids") is not None:
        try:
            out["streamed"] = parse_streamed({**job, "stream": True}, config, renderers)
        except Exception as e:  # noqa: BLE001 - reported, the test names it
            out["streamed"] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
    return out


def parse_streamed(job: dict[str, Any], config: Any, renderers: dict[str, Any]) -> dict[str, Any]:
    """The sampled ids one at a time through a fresh parser's parse_delta, the deltas summed."""
    tokenizer, parser, request = _parser(job, config, renderers)
    ids = list(job["ids"])
    reasoning, content = "", ""
    calls: dict[int, dict[str, str]] = {}
    emitted, pending = "", []
    for i, tid in enumerate(ids):
        pending.append(tid)
        finished = i == len(ids) - 1
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=request.skip_special_tokens)
        if text.endswith("\ufffd") and not finished:
            continue  # inside a UTF-8 character: the detokenizer waits for the rest
        delta, emitted = text[len(emitted):], text
        msg = parser.parse_delta(delta, pending, request, prompt_token_ids=job["prompt_ids"], finished=finished)
        pending = []
        if msg is None:
            continue
        reasoning += msg.reasoning or ""
        content += msg.content or ""
        for tc in msg.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function is not None:
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
    return {"reasoning": reasoning or None, "content": content or None,
            "tool_calls": [{"name": c["name"], "arguments": json.loads(c["arguments"] or "{}")}
                           for _, c in sorted(calls.items())]}


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
