"""Per-family tool-call and reasoning parsers, chosen by the names vLLM gives its parsers
(`rowgrove serve --tool-parser NAME --reasoning-parser NAME`), and auto-detection of both from a
chat template's text. See docs/parsers.md.

Each tool parser is a module with `parse(text, tools) -> ToolParse`; each reasoning parser a
function `split(text) -> (reasoning, content)` (see `rowgrove.parsers._common`). `parse_output`
runs the reasoning parser first and the tool parser on what content is left, then gives every
call an id, the id the model sampled where the format has one (kimi_k2, some Mistral outputs).
Parsing never raises on any text; an unknown parser name raises ValueError.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from rowgrove.parsers import deepseek_r1, deepseek_v31, glm45, hermes, kimi_k2, llama3_json, mistral, openai, qwen3, qwen3_coder
from rowgrove.parsers._common import ToolParse
from rowgrove.toolcalls import ParsedMessage, tool_call_id

__all__ = ["TOOL_PARSERS", "REASONING_PARSERS", "ID_STYLES", "detect_tool_parser", "detect_reasoning_parser",
           "parse_output", "tool_call_id_style", "make_tool_call_id", "ParsedMessage"]

TOOL_PARSERS: tuple[str, ...] = ("hermes", "llama3_json", "mistral", "qwen3_coder", "deepseek_v31", "deepseek_v3",
                                 "openai", "glm45", "kimi_k2")
REASONING_PARSERS: tuple[str, ...] = ("qwen3", "deepseek_r1", "deepseek_v3", "openai", "glm45", "kimi_k2", "mistral")
ID_STYLES: tuple[str, ...] = ("openai", "mistral", "kimi")

_TOOL: dict[str, Callable[[str, list | None], ToolParse]] = {
    "hermes": hermes.parse, "llama3_json": llama3_json.parse, "llama4_json": llama3_json.parse,
    "mistral": mistral.parse, "qwen3_coder": qwen3_coder.parse, "qwen3_xml": qwen3_coder.parse,
    "deepseek_v31": deepseek_v31.parse, "deepseek_v3": deepseek_v31.parse, "openai": openai.parse,
    "glm45": glm45.parse, "glm47": glm45.parse, "kimi_k2": kimi_k2.parse,
}
_REASONING: dict[str, Callable[[str], tuple[str | None, str | None]]] = {
    "qwen3": qwen3.split, "deepseek_r1": deepseek_r1.split_r1, "deepseek_v3": deepseek_r1.split_v3,
    "openai": openai.split, "openai_gptoss": openai.split, "glm45": glm45.split, "kimi_k2": kimi_k2.split,
    "mistral": mistral.split,
}
_HARMONY = ("openai", "openai_gptoss")

_DS_TOOLS = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")
_DS_MARKS = _DS_TOOLS + ("<｜Assistant｜>", "<｜User｜>")
_KIMI_MARKS = ("<|tool_calls_section_begin|>", "<|im_middle|>")


def detect_tool_parser(chat_template: str) -> str | None:
    """The tool parser for a chat template, from the syntax its text renders; None when it renders
    no tool calls. First match wins: DeepSeek's `<｜tool▁call▁begin｜>` (`deepseek_v3` when calls are
    fenced as ```json, else `deepseek_v31`), Kimi's `<|tool_calls_section_begin|>`, harmony's
    `<|channel|>` (`openai`), `[TOOL_CALLS]` (`mistral`), `<arg_key>` (`glm45`), `<function=` with
    `<parameter=` (`qwen3_coder`), `<tool_call>` (`hermes`), `<|python_tag|>` or `"parameters"`
    with `<|eot_id|>` (`llama3_json`)."""
    t = chat_template or ""
    if any(m in t for m in _DS_TOOLS):
        return "deepseek_v3" if "```json" in t else "deepseek_v31"
    if "<|tool_calls_section_begin|>" in t:
        return "kimi_k2"
    if "<|channel|>" in t:
        return "openai"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<arg_key>" in t:
        return "glm45"
    if "<function=" in t and "<parameter=" in t:
        return "qwen3_coder"
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or ('"parameters"' in t and "<|eot_id|>" in t):
        return "llama3_json"
    return None


def detect_reasoning_parser(chat_template: str) -> str | None:
    """The reasoning parser for a chat template; None when it has no reasoning. Harmony
    (`<|channel|>`) -> `openai`; DeepSeek with `<think>` -> `deepseek_v3` when the template can write
    an empty `<think></think>` (V3.1/V3.2 switch thinking off, so a missing `</think>` means no
    reasoning) else `deepseek_r1`; Kimi with `<think>` -> `kimi_k2`; GLM (`[gMASK]`/`<arg_key>`) with
    `<think>` -> `glm45`; `[THINK]` -> `mistral`; any other `<think>` -> `qwen3`."""
    t = chat_template or ""
    if "<|channel|>" in t:
        return "openai"
    think = "<think>" in t or "</think>" in t
    if any(m in t for m in _DS_MARKS) and think:
        return "deepseek_v3" if "<think></think>" in t else "deepseek_r1"
    if any(m in t for m in _KIMI_MARKS) and think:
        return "kimi_k2"
    if ("[gMASK]" in t or "<arg_key>" in t) and think:
        return "glm45"
    if "[THINK]" in t:
        return "mistral"
    if think:
        return "qwen3"
    return None


def tool_call_id_style(chat_template: str) -> str:
    """How the template wants tool-call ids: "mistral" (exactly 9 alphanumerics, which Mistral
    templates enforce), "kimi" (`functions.NAME:IDX`, which Kimi templates render back to the
    model), else "openai" (`call_` + 24 hex)."""
    t = chat_template or ""
    if "[TOOL_CALLS]" in t or "length 9" in t:
        return "mistral"
    if "<|tool_calls_section_begin|>" in t:
        return "kimi"
    return "openai"


_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def make_tool_call_id(style: str, id_seed: str, index: int, name: str, arguments: str) -> str:
    """A deterministic tool-call id, unique per (id_seed, index) for "openai" and "mistral";
    "kimi" is `functions.NAME:INDEX`."""
    if style == "openai":
        return tool_call_id(id_seed, index, name, arguments)
    if style == "mistral":
        n = int.from_bytes(hashlib.sha256(f"{id_seed}\x00{index}\x00{name}\x00{arguments}".encode()).digest(), "big")
        out = []
        for _ in range(9):
            n, r = divmod(n, 62)
            out.append(_ALNUM[r])
        return "".join(out)
    if style == "kimi":
        return f"functions.{name}:{index}"
    raise ValueError(f"unknown tool-call id style {style!r}; expected one of {ID_STYLES}")


def _check(kind: str, name: str | None, known: dict) -> None:
    if name is not None and name not in known:
        raise ValueError(f"unknown {kind} parser {name!r}; expected one of {sorted(known)}")


def parse_output(text: str, *, tool_parser: str | None, reasoning_parser: str | None,
                 id_seed: str = "", tools: list | None = None, id_style: str = "openai") -> ParsedMessage:
    """Sampled assistant text (special tokens kept, the final stop token removed) as an assistant
    message: reasoning by `reasoning_parser`, tool calls by `tool_parser` (either None: not parsed),
    `tools` the request's OpenAI tools (schemas type qwen3_coder / glm45 values). Ids are the
    sampled ones where the format has them, else `make_tool_call_id(id_style, id_seed, i, ...)`.
    Never raises on any text; unknown parser names or id style raise ValueError."""
    _check("tool", tool_parser, _TOOL)
    _check("reasoning", reasoning_parser, _REASONING)
    if id_style not in ID_STYLES:
        raise ValueError(f"unknown tool-call id style {id_style!r}; expected one of {ID_STYLES}")
    text = text or ""
    reasoning: str | None = None
    if tool_parser in _HARMONY or reasoning_parser in _HARMONY:
        h = openai.read(text, tool_calls=tool_parser in _HARMONY)
        parsed = h.tools
        if reasoning_parser in _HARMONY:
            reasoning = h.reasoning
    else:
        rest: str | None = text
        if reasoning_parser is not None:
            reasoning, rest = _REASONING[reasoning_parser](text)
        if rest is None:
            parsed = ToolParse("")
        elif tool_parser is not None:
            parsed = _TOOL[tool_parser](rest, tools)
        else:
            parsed = ToolParse(rest)
    tool_calls = []
    seen: set[str] = set()
    for i, call in enumerate(parsed.calls):
        cid = call.id if call.id and call.id not in seen else make_tool_call_id(id_style, id_seed, i, call.name, call.arguments)
        seen.add(cid)
        tool_calls.append({"id": cid, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
    return ParsedMessage(content=parsed.content or None, tool_calls=tool_calls, reasoning=reasoning, errors=list(parsed.errors))
