"""Tiny models of the real families (tests/families.py, rowgrove.model.family): each builds
deterministically, loads through rowgrove's loader and AutoTokenizer with the raw tokenizer's ids,
holds exactly its family's added tokens (each one id), lists its stop ids in generation_config,
renders a tool conversation with its real template, and `native()` text ends on a stop id and
relates to the template's history rendering in the documented way."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import tokenizers
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from families import FAMILIES, require_families, family, family_model_dir, tool_call_id  # noqa: E402

from rowgrove.errors import InputError  # noqa: E402
from rowgrove.model.family import MARKER, build_family_model  # noqa: E402
from rowgrove.model.load import load_model, load_tokenizer  # noqa: E402

require_families(module=True)

NAMES = list(FAMILIES)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ARGS = {"city": "Paris ünï", "days": 2}
CASES = {
    "content": {"content": "It is 21 degrees."},
    "reasoning": {"content": "It is 21 degrees.", "reasoning": "Easy one."},
    "tool": {"tool_calls": [("get_weather", ARGS)]},
    "content+tool": {"content": "Checking.", "tool_calls": [("get_weather", ARGS)]},
    "reasoning+tool": {"reasoning": "Need the tool.", "tool_calls": [("get_weather", ARGS)]},
    "two tools": {"tool_calls": [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]},
}


def _supported(fam, case) -> bool:
    c = CASES[case]
    calls = c.get("tool_calls", ())
    return not ((c.get("reasoning") is not None and not fam.thinking)
                or (len(calls) > 1 and not fam.parallel_tool_calls)
                or (calls and c.get("content") and not fam.content_with_tool_calls)
                or (calls and c.get("reasoning") is not None and not fam.reasoning_with_tool_calls))


def _assistant(fam, content=None, tool_calls=(), reasoning=None) -> dict:
    """The history message for a native() case, as the family's template reads it."""
    msg: dict = {"role": "assistant", "content": content or ""}
    if tool_calls:
        msg["tool_calls"] = [{"id": tool_call_id(i), "type": "function", "function": {"name": n, "arguments": a}}
                             for i, (n, a) in enumerate(tool_calls)]
    if reasoning is not None:
        if fam.reasoning_field:
            msg[fam.reasoning_field] = reasoning
        else:  # DeepSeek reads reasoning from the content, before </think>
            msg["content"] = reasoning + "</think>" + msg["content"]
    return msg


def _conversation(fam) -> list[dict]:
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris? 12345"},
            _assistant(fam, tool_calls=[("get_weather", ARGS)]),
            {"role": "tool", "tool_call_id": tool_call_id(0), "content": '{"temp": 21}'},
            {"role": "assistant", "content": "It is 21."}, {"role": "user", "content": "Thanks"}]
    return conv


@pytest.fixture(scope="module")
def dirs() -> dict[str, Path]:
    return {name: family_model_dir(name) for name in NAMES}


@pytest.fixture(scope="module")
def toks(dirs):
    return {name: AutoTokenizer.from_pretrained(str(d)) for name, d in dirs.items()}


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_builds_are_byte_identical(dirs, tmp_path):
    # a fresh build in this process equals the cached one (perhaps built by an earlier run)
    for name in NAMES:
        fresh = build_family_model(tmp_path / name, **family(name).build_kwargs())
        assert _files(fresh) == _files(dirs[name]), name
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json",
            "generation_config.json", MARKER} == set(_files(dirs["qwen3"]))


def test_cached_and_refuses_foreign_dir(tmp_path):
    kw = family("glm-4.6").build_kwargs()
    d = build_family_model(tmp_path / "glm", **kw)
    os.utime(d / "model.safetensors", ns=(1, 1))
    assert build_family_model(tmp_path / "glm", **kw) == d
    assert (d / "model.safetensors").stat().st_mtime_ns == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "mine.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a family-model build"):
        build_family_model(tmp_path / "other", **kw)
    assert (tmp_path / "other" / "mine.txt").read_text() == "keep me"
    with pytest.raises(InputError, match="eos_tokens"):
        build_family_model(tmp_path / "x", chat_template="{{ 1 }}", special_tokens=["<a>"], eos_tokens=[])


@pytest.mark.parametrize("name", NAMES)
def test_vocabulary_holds_the_family_tokens(name, dirs, toks):
    fam, tok = family(name), toks[name]
    raw = tokenizers.Tokenizer.from_file(str(dirs[name] / "tokenizer.json"))
    added = {t.content: t.special for t in raw.get_added_tokens_decoder().values()}
    specials = set(fam.special_tokens) | {t for t in (fam.bos, fam.pad, fam.eos_token, *fam.eos_tokens) if t}
    assert added == {**{t: False for t in fam.extra_tokens}, **{t: True for t in specials}}
    for t in added:  # every added token is one id, also between words
        assert tok.encode(t, add_special_tokens=False) == [tok.convert_tokens_to_ids(t)], t
    text = "x" + "a b".join(added) + "y"
    assert [i for i in tok.encode(text, add_special_tokens=False) if i >= len(tok) - len(added)] == \
        [tok.convert_tokens_to_ids(t) for t in added]
    assert (dirs[name] / "chat_template.jinja").read_text(encoding="utf-8") == fam.chat_template()


@pytest.mark.parametrize("name", NAMES)
def test_eos_bos_and_generation_config(name, dirs, toks):
    fam, tok = family(name), toks[name]
    eos_ids = [tok.convert_tokens_to_ids(t) for t in fam.eos_tokens]
    gen = json.loads((dirs[name] / "generation_config.json").read_text())
    assert gen["eos_token_id"] == eos_ids
    assert json.loads((dirs[name] / "config.json").read_text())["eos_token_id"] == eos_ids
    assert tok.eos_token == fam.eos_token and tok.bos_token == fam.bos and tok.pad_token == fam.pad
    ids = tok.encode("hello")
    assert ids[0] == tok.bos_token_id if fam.add_bos else ids == tok.encode("hello", add_special_tokens=False)


@pytest.mark.parametrize("name", NAMES)
def test_loads_and_renders_a_tool_conversation(name, dirs, toks):
    fam, auto = family(name), toks[name]
    tok = load_tokenizer(str(dirs[name]))
    raw = tokenizers.Tokenizer.from_file(str(dirs[name] / "tokenizer.json"))
    text = auto.apply_chat_template(_conversation(fam), tools=TOOLS, tokenize=False, add_generation_prompt=True)
    ids = auto.encode(text, add_special_tokens=False)
    assert ids == tok.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids
    assert auto.encode(text) == tok.encode(text) == raw.encode(text).ids
    assert auto.decode(ids) == text
    rendered = auto.apply_chat_template(_conversation(fam), tools=TOOLS, add_generation_prompt=True,
                                        return_dict=False)
    assert list(rendered) == ids
    if fam.bos:
        assert (ids[0] == auto.bos_token_id) == text.startswith(fam.bos)
    model, _ = load_model(str(dirs[name]))
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert model.generation_config.eos_token_id == [auto.convert_tokens_to_ids(t) for t in fam.eos_tokens]
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids[-64:]])).logits
    assert logits.shape == (1, min(64, len(ids)), len(tok))


def _expected_history(fam, case: str, native: str) -> str:
    """What the template writes after the generation prompt for the case's assistant message,
    from the sampled text: the documented differences between history and sampled forms."""
    c = CASES[case]
    if fam.name in ("qwen2.5", "qwen3"):
        return native + "\n"  # the newline after <|im_end|> is template, not sampled
    if fam.name == "glm-4.6":  # the stop token is the next turn's role token
        return native.removesuffix("<|observation|>" if c.get("tool_calls") else "<|user|>")
    if fam.name == "gpt-oss" and c.get("tool_calls"):  # history puts the recipient in the header
        return native.replace("<|channel|>commentary to=functions.get_weather <|constrain|>json",
                              " to=functions.get_weather<|channel|>commentary json")
    if fam.name == "deepseek-v3.1" and c.get("reasoning") is not None:  # history drops reasoning
        return native.removeprefix(c["reasoning"])
    return native


@pytest.mark.parametrize("name", NAMES)
def test_native_ends_on_a_stop_id_and_matches_the_template(name, toks):
    fam, tok = family(name), toks[name]
    stop_ids = {tok.convert_tokens_to_ids(t) for t in fam.eos_tokens}
    # Mistral writes the system message into the LAST user turn only, so history renders drop it
    base = [{"role": "user", "content": "Weather in Paris?"}]
    if fam.name != "mistral-nemo":
        base.insert(0, {"role": "system", "content": "Be brief."})
    seen = 0
    for case, c in CASES.items():
        if not _supported(fam, case):
            with pytest.raises(ValueError):
                fam.native(**c)
            continue
        seen += 1
        text = fam.native(**c)
        ids = tok.encode(text, add_special_tokens=False)
        assert ids[-1] in stop_ids and not set(ids[:-1]) & stop_ids, case
        assert tok.decode(ids) == text
        kw = fam.prompt_kwargs(thinking=c.get("reasoning") is not None)
        prompt = tok.apply_chat_template(base, tools=TOOLS, tokenize=False, add_generation_prompt=True, **kw)
        history = tok.apply_chat_template(base + [_assistant(fam, **c)], tools=TOOLS, tokenize=False, **kw)
        assert history.startswith(prompt), case
        assert history[len(prompt):] == _expected_history(fam, case, text), case
    assert seen >= 2


def test_native_formats_spelled_out():
    f = family
    assert f("qwen3").native("C", reasoning="R") == "<think>\nR\n</think>\n\nC<|im_end|>"
    assert f("qwen2.5").native(tool_calls=[("f", {"k": 1})]) == \
        '<tool_call>\n{"name": "f", "arguments": {"k": 1}}\n</tool_call><|im_end|>'
    assert f("llama3.1").native(tool_calls=[("f", {"k": 1})]) == '{"name": "f", "parameters": {"k": 1}}<|eot_id|>'
    openai_call = {"id": "abcdefghi", "type": "function", "function": {"name": "f", "arguments": '{"k": 1}'}}
    assert f("mistral-nemo").native(tool_calls=[openai_call]) == \
        '[TOOL_CALLS][{"name": "f", "arguments": {"k": 1}, "id": "abcdefghi"}]</s>'
    assert f("deepseek-v3.1").native(tool_calls=[("f", {"k": 1})]) == (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"k\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
        "<｜end▁of▁sentence｜>")
    assert f("gpt-oss").native(tool_calls=[("f", {"k": 1})], reasoning="R") == (
        "<|channel|>analysis<|message|>R<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"k\": 1}<|call|>")
    assert f("gpt-oss").native("C") == "<|channel|>final<|message|>C<|return|>"
    assert f("glm-4.6").native("C", tool_calls=[("f", {"k": "v", "n": 2})], reasoning="R") == (
        "\n<think>R</think>\nC\n<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n"
        "<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call><|observation|>")
    assert f("glm-4.6").native("C") == "\nC<|user|>"
