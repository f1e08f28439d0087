"""Auto-detection from template text, id styles and ids."""

from __future__ import annotations

import re

import pytest
from parser_templates import template

from rowgrove.parsers import (REASONING_PARSERS, TOOL_PARSERS, detect_reasoning_parser, detect_tool_parser, make_tool_call_id,
                              tool_call_id_style)
from rowgrove.toolcalls import tool_call_id

REAL = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", None, "openai"),
    "Qwen-Qwen3-0.6B.jinja": ("hermes", "qwen3", "openai"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3_json", None, "openai"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", None, "mistral"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("deepseek_v31", "deepseek_v3", "openai"),
    "openai-gpt-oss-120b.jinja": ("openai", "openai", "openai"),
    "GLM-4.6.jinja": ("glm45", "glm45", "openai"),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_templates(name):
    t = template(name)
    assert (detect_tool_parser(t), detect_reasoning_parser(t), tool_call_id_style(t)) == REAL[name]


# template snippets of families without a file in /work/shared/templates
SNIPPETS = [
    ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' + k + '>\\n' }}", "qwen3_coder", None, "openai"),
    ("<|im_middle|>{% if thinking %}<think>{% endif %}<|tool_calls_section_begin|><|tool_call_begin|>{{ tc.id }}", "kimi_k2", "kimi_k2", "kimi"),
    ("<｜Assistant｜>{{'<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + name + '\\n```json\\n'}}{{'<think>\\n'}}",
     "deepseek_v3", "deepseek_r1", "openai"),
    ("{{ '[SYSTEM_PROMPT]' }}[THINK]{{ t }}[/THINK][TOOL_CALLS]{{ name }}[ARGS]{{ args }}", "mistral", "mistral", "mistral"),
    ("<|start_header_id|>assistant<|end_header_id|>\n\n<|eot_id|>", None, None, "openai"),
    ("{{ messages }}", None, None, "openai"),
    ("", None, None, "openai"),
]


@pytest.mark.parametrize("text,tp,rp,style", SNIPPETS)
def test_snippets(text, tp, rp, style):
    assert (detect_tool_parser(text), detect_reasoning_parser(text), tool_call_id_style(text)) == (tp, rp, style)


def test_detected_names_are_known():
    for name in REAL:
        t = template(name)
        assert detect_tool_parser(t) in TOOL_PARSERS and detect_reasoning_parser(t) in REASONING_PARSERS + (None,)


def test_make_tool_call_id():
    assert make_tool_call_id("openai", "s", 0, "f", "{}") == tool_call_id("s", 0, "f", "{}")
    assert re.fullmatch(r"call_[0-9a-f]{24}", make_tool_call_id("openai", "s", 1, "f", "{}"))
    ids = {make_tool_call_id("mistral", f"seed{j}", i, "f", "{}") for i in range(50) for j in range(20)}
    assert len(ids) == 1000 and all(re.fullmatch(r"[A-Za-z0-9]{9}", x) for x in ids)
    assert make_tool_call_id("mistral", "s", 0, "f", "{}") == make_tool_call_id("mistral", "s", 0, "f", "{}")
    assert make_tool_call_id("kimi", "s", 2, "get_weather", "{}") == "functions.get_weather:2"
    with pytest.raises(ValueError):
        make_tool_call_id("other", "s", 0, "f", "{}")
