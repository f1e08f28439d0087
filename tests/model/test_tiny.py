"""The tiny model builds offline, deterministically, is cached, and its three tokenizer loaders
agree on the ids of a chat rendering (transformers 5 pitfall, FACTS.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rowgrove.errors import InputError
from rowgrove.model.load import end_of_turn_id, load_model, load_tokenizer
from rowgrove.model.templates import TEMPLATES
from rowgrove.model.tiny import SPECIAL_TOKENS, TOOL_TOKENS, build_tiny_model, config_hash, tiny_model_dir

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris? 12345 ünïcode"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21.", "reasoning_content": "easy"},
    {"role": "user", "content": "Thanks"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_build_is_byte_identical_and_cached(tmp_path):
    a = build_tiny_model(tmp_path / "a", seed=3)
    b = build_tiny_model(tmp_path / "b", seed=3)
    assert _files(a) == _files(b)
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja", "config.json"} <= set(_files(a))
    # cached: a second call leaves the files untouched
    mtimes = {p.name: p.stat().st_mtime_ns for p in a.iterdir()}
    os.utime(a / "model.safetensors", ns=(1, 1))
    assert build_tiny_model(tmp_path / "a", seed=3) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == 1
    assert set(mtimes) == {p.name for p in a.iterdir()}
    # another seed is another model, and rebuilding in place replaces our own old build
    c = build_tiny_model(tmp_path / "a", seed=4)
    assert json.loads((c / "rowgrove-tiny.json").read_text())["seed"] == 4
    assert (c / "model.safetensors").read_bytes() != _files(b)["model.safetensors"]


def test_refuses_foreign_directory(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a tiny-model build"):
        build_tiny_model(tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_tiny_model_dir_uses_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROWGROVE_CACHE", str(tmp_path))
    d = tiny_model_dir("llama3", seed=1)
    h = config_hash(template="llama3", seed=1, layers=2, hidden=64, vocab_size=1024, extra_corpus=())
    assert d == tmp_path / f"tiny-{h}"
    assert tiny_model_dir("llama3", seed=1) == d


@pytest.mark.parametrize("template", ["chatml", "qwen3", "llama3"])
def test_three_tokenizer_loaders_agree(template, tmp_path):
    d = build_tiny_model(tmp_path / template, template=template)
    auto = AutoTokenizer.from_pretrained(d)
    fast = PreTrainedTokenizerFast(tokenizer_file=str(d / "tokenizer.json"))
    raw = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    text = auto.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    ids = auto.encode(text, add_special_tokens=False)
    assert ids == fast.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids
    assert auto.encode(text) == ids  # no BOS/EOS added behind the template's back
    assert auto.decode(ids) == text
    # every special and tool token is one id
    for tok in SPECIAL_TOKENS + TOOL_TOKENS:
        assert len(auto.encode(tok, add_special_tokens=False)) == 1, tok
    assert (d / "chat_template.jinja").read_text() == TEMPLATES[template].jinja
    assert auto.eos_token == TEMPLATES[template].end_of_turn
    assert auto.pad_token_id is not None


@pytest.mark.parametrize("spec,eot", [("tiny", "<|im_end|>"), ("tiny-qwen3", "<|im_end|>"), ("tiny-llama3", "<|eot_id|>")])
def test_load_specs_and_end_of_turn(spec, eot):
    tok = load_tokenizer(spec)
    assert tok.convert_ids_to_tokens(end_of_turn_id(tok)) == eot
    model, tok2 = load_model(spec)
    assert model.generation_config.eos_token_id == end_of_turn_id(tok)
    assert model.get_input_embeddings().weight.shape[0] == len(tok2)
    assert not model.training


def test_load_unknown_spec_says_what_to_do(tmp_path):
    with pytest.raises(InputError, match="neither a tiny spec"):
        load_tokenizer(str(tmp_path / "nope"))


def test_heads_and_tying_are_build_options_and_the_default_build_keeps_its_name(tmp_path):
    """`heads` / `tie_embeddings` shape the model (servable_kwargs: head_dim 32, what vLLM's CPU
    attention needs); the default configuration hashes as before, so cached folders stay valid."""
    import json

    from safetensors import safe_open

    from rowgrove.errors import InputError
    from rowgrove.model.tiny import build_tiny_model, config_hash, servable_kwargs

    base = dict(template="chatml", seed=0, layers=2, hidden=64, vocab_size=1024, extra_corpus=())
    assert config_hash(**base) == config_hash(**base, heads=4, tie_embeddings=True)
    assert config_hash(**base, heads=2) != config_hash(**base)
    assert config_hash(**base, tie_embeddings=False) != config_hash(**base)
    out = build_tiny_model(tmp_path / "m", **servable_kwargs(), tie_embeddings=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    assert cfg["num_key_value_heads"] == 1 and cfg["tie_word_embeddings"] is False
    with safe_open(str(out / "model.safetensors"), "pt") as st:
        assert "lm_head.weight" in set(st.keys())
    with pytest.raises(InputError, match="heads"):
        build_tiny_model(tmp_path / "bad", hidden=64, heads=3)
