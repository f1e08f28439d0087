"""The parser round trips on the real vocabularies (tests/realfiles.py; they skip without them):
for each family with a real tokenizer, what the model samples in its own format (tool calls with
non-ASCII and nested arguments, content, reasoning) is encoded by the family's model folder on that
vocabulary, cut before its stop token as an engine stops, decoded as the gateway decodes sampled
ids (special tokens kept), and parsed by the parsers detected from the real template. The byte-level
BPE of a 128k-200k vocabulary merges across the format's markers differently from the tiny one:
every marker must stay one id, the ids must decode to the same text, and the parse must be the
one the text gives."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from families import FAMILIES, family, family_model_dir  # noqa: E402

from rowgrove.model.load import load_tokenizer, stop_token_ids  # noqa: E402
from rowgrove.parsers import detect_reasoning_parser, detect_tool_parser, parse_output  # noqa: E402

REAL = [n for n, f in FAMILIES.items() if f.tokenizer is not None]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "detail": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
        "tz": {"type": "string"}}}}}]
ARGS1 = {"city": "São Paulo", "days": 3, "detail": {"wind": True, "levels": [1, 2.5, None], "note": "  two  spaces"}}
ARGS2 = {"tz": "Asia/Tokyo — 東京 🌸"}


def cases(name: str) -> list[tuple[str, dict]]:
    """(what, native() arguments) the family can sample."""
    fam = family(name)
    out = [("content", {"content": "Paris: sunny, 21 °C.\n\n- wind 3 m/s\n- 東京 ✓"}),
           ("one call", {"tool_calls": [("get_weather", ARGS1)]})]
    if fam.parallel_tool_calls:
        out.append(("two calls", {"tool_calls": [("get_weather", ARGS1), ("get_time", ARGS2)]}))
    if fam.content_with_tool_calls:
        out.append(("content and call", {"content": "Let me check.", "tool_calls": [("get_time", ARGS2)]}))
    if fam.thinking:
        out.append(("reasoning", {"content": "Sunny.", "reasoning": "The user asks about\nweather — in Paris."}))
        if fam.reasoning_with_tool_calls:
            out.append(("reasoning and call", {"reasoning": "Call the tool.", "tool_calls": [("get_weather", ARGS1)]}))
    return out


@pytest.mark.parametrize("name", REAL)
def test_sampled_ids_parse_as_the_text_does(name):
    fam = family(name)
    folder = family_model_dir(name, vocab="real")  # skips without the real tokenizer
    tok = load_tokenizer(str(folder))
    assert len(tok) > 100_000  # the real vocabulary, not the tiny one
    template = fam.chat_template()
    tp, rp = detect_tool_parser(template), detect_reasoning_parser(template)
    stops = set(stop_token_ids(tok, folder))
    markers = [t for t in (*fam.special_tokens, *fam.extra_tokens)]
    for what, kw in cases(name):
        native = fam.native(**kw)
        ids = tok.encode(native, add_special_tokens=False)
        for m in markers:  # every marker in the sample is one id of the vocabulary
            if m in native:
                assert tok.convert_tokens_to_ids(m) in ids, (name, what, m)
        assert ids[-1] in stops and not set(ids[:-1]) & stops, (name, what)
        sampled = ids[:-1]  # the engine stops on the stop id; the parser reads what came before
        text = tok.decode(sampled, skip_special_tokens=False)
        stop_text = tok.decode(ids[-1:], skip_special_tokens=False)
        assert text + stop_text == native, (name, what)
        got = parse_output(text, tool_parser=tp, reasoning_parser=rp, tools=TOOLS, id_seed="s")
        assert got.errors == [], (name, what, got.errors)
        want_calls = [(n, a) for n, a in kw.get("tool_calls", [])]
        assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got.tool_calls] == \
            want_calls, (name, what)
        assert (got.content or "").strip() == (kw.get("content") or "").strip(), (name, what, got.content)
        assert (got.reasoning or "").strip() == (kw.get("reasoning") or "").strip(), (name, what, got.reasoning)
