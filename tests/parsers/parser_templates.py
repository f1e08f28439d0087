"""Helpers for the parser tests: render an assistant turn through a real chat template (read from
tests/realfiles.py) and cut out what the model would have
sampled. A test whose template is missing skips, with the suite's uniform reason."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from realfiles import template_text  # noqa: E402

# (bos, eos, end-of-turn suffixes the sampler stops on, which are not part of the sampled text)
SPECIALS = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("", "<|im_end|>", ("<|im_end|>\n", "<|im_end|>")),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>", ("<|im_end|>\n", "<|im_end|>")),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>", ("<|eot_id|>", "<|eom_id|>")),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>", ("</s>",)),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ("<｜end▁of▁sentence｜>",)),
    "openai-gpt-oss-120b.jinja": ("", "<|return|>", ("<|call|>", "<|return|>", "<|end|>")),
    "GLM-4.6.jinja": ("", "<|endoftext|>", ()),
}


def template(name: str) -> str:
    """The real chat template `name`; skips the test when the templates folder lacks it."""
    return template_text(name)


def render(name: str, messages: list[dict], tools: list | None = None, **kwargs) -> str:
    bos, eos, _ = SPECIALS[name]
    out, _ = render_jinja_template([messages], tools=tools, chat_template=template(name),
                                   bos_token=bos, eos_token=eos, **kwargs)
    return out[0]


def sampled_assistant(name: str, history: list[dict], assistant: dict, tools: list | None = None, **kwargs) -> str:
    """The text a model would sample for `assistant` after `history` (generation prompt cut off,
    final stop token removed)."""
    prompt = render(name, history, tools, add_generation_prompt=True, **kwargs)
    full = render(name, history + [assistant], tools, **kwargs)
    assert full.startswith(prompt), (prompt[-200:], full[-400:])
    body = full[len(prompt):]
    for suffix in SPECIALS[name][2]:
        if body.endswith(suffix):
            body = body[:-len(suffix)]
            break
    return body


def tool_calls(*calls: tuple[str, dict], ids: list[str] | None = None) -> list[dict]:
    return [{"id": (ids[i] if ids else f"call{i:05d}ab"[:9]), "type": "function",
             "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(calls)]
