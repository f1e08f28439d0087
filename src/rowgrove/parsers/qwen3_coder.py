"""`qwen3_coder`: Qwen3-Coder (and Qwen3.5-style) XML tool calls:

    <tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>

Matches vLLM's `qwen3_coder` parser (`vllm/entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py`).
Values are text; with the request's tool JSON schema they are typed: integer, number, boolean,
object/array (JSON), `null` -> None (unless the property is a string). A value that does not
convert stays a string (vLLM turns a bad boolean into false). Without a schema -- or for a
property the schema does not list -- values stay strings, as in vLLM. One leading and one
trailing newline of a value are the template's and are dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rowgrove.parsers._common import RawCall, ToolParse, dumps, scan_blocks, schema_type, tool_properties

NAMES = ("qwen3_coder", "qwen3_xml")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_BARE = re.compile(r"<function=[^>\n]*>.*?</function>", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)


def convert(value: str, prop: Any) -> Any:
    """One parameter value typed by its schema property (None: unknown -> string)."""
    t = schema_type(prop)
    if prop is None:
        return value
    if t in ("string", "str", "text", "varchar", "char", "enum"):
        return value
    if value.strip().lower() == "null":
        return None
    v = value.strip()
    if t is None:
        try:
            return json.loads(v)
        except ValueError:
            return value
    if t.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(v)
        except ValueError:
            try:
                f = float(v)
                return int(f) if f.is_integer() else value
            except ValueError:
                return value
    if t.startswith(("num", "float", "double")):
        try:
            f = float(v)
        except ValueError:
            return value
        if f != f or f in (float("inf"), float("-inf")):
            return value
        return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f
    if t in ("boolean", "bool", "binary"):
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        return value
    try:
        return json.loads(v)
    except ValueError:
        return value


def _read_functions(body: str, tools: list | None) -> list[RawCall] | str:
    found = list(_FUNCTION.finditer(body))
    if not found:
        return "no <function=NAME> in the block"
    calls = []
    for fm in found:
        name = fm.group(1).strip()
        if not name:
            return "<function=> without a name"
        props = tool_properties(tools, name)
        args: dict[str, Any] = {}
        for pm in _PARAM.finditer(fm.group(2)):
            key = pm.group(1).strip()
            value = pm.group(2)
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            args[key] = convert(value, None if props is None else props.get(key))
        calls.append(RawCall(name, dumps(args)))
    return calls


def parse(text: str, tools: list | None = None) -> ToolParse:
    blocks = list(_BLOCK.finditer(text)) or list(_BARE.finditer(text))  # vLLM's fallback: bare <function=..>
    return scan_blocks(text, blocks, lambda m: _read_functions(m.group(1) if m.re is _BLOCK else m.group(0), tools),
                       label="qwen3_coder block", open_tag=OPEN, close_tag=CLOSE)


def format_call(name: str, arguments: dict) -> str:
    """The text the Qwen3-Coder template renders for one call (mappings and lists as JSON,
    everything else with Jinja's `string` filter, i.e. Python's str)."""
    out = f"<tool_call>\n<function={name}>\n"
    for k, v in arguments.items():
        s = json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else str(v)
        out += f"<parameter={k}>\n{s}\n</parameter>\n"
    return out + "</function>\n</tool_call>"
