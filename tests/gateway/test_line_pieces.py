"""A root's text cut into lines (`core.pieces`) tokenizes as the whole text does: for the tiny
models' byte-level tokenizers, and for tokenizers built here with the word-cutting expressions of
Qwen2/Qwen3 and Llama 3 (Split + ByteLevel, NFC), over generated text full of the characters that
sit on the edge of a word (newlines with and without whitespace around them, \\r, tabs, marks,
digits, quotes, CJK, emoji, the template's own added tokens). Tokenizers whose pre-tokenization is
not proven are never cut."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowgrove.gateway.core.pieces import _SAFE_SPLITS, lines_cut_exactly, split_lines, units_of

QWEN2, LLAMA3 = sorted(_SAFE_SPLITS, key=lambda p: "{1,3}" in p)  # the second is Llama 3's
EDGE = ["\n", "\n\n", " \n", "\n ", "\r\n", "\t", " ", "  ", "a", "Z", "é", "e\u0301", "\u0301", "7", "123",
        "'s", "'ll", "\"", "<", ">", "&", ")", ".", ":", "{", "}", "中文", "🙂", "_", "-", "#"]


def texts(added: list[str]):
    return st.lists(st.sampled_from(EDGE + added), max_size=60).map("".join)


# merges of whitespace runs the tiny vocabulary lacks: without them a wrong cut (" \n" + "X"
# where the whole text cuts " " + "\nX") can give the same ids by accident, and nothing is tested
# (byte-level spelling: space Ġ, newline Ċ, tab ĉ, carriage return č)
WHITESPACE_MERGES = [("Ġ", "Ċ"), ("Ċ", "Ċ"), ("Ċ", "Ġ"), ("č", "Ċ"), ("ĉ", "Ċ"), ("Ġ", "Ġ"), ("ĠĠ", "Ċ"),
                     ("ĊĊ", "Ċ"), ("Ċ", "ĉ")]


def _variant(tok, pre_tokenizer, normalizer=None):
    """The tiny tokenizer's vocabulary and merges, with WHITESPACE_MERGES added, under another
    pre-tokenizer and normaliser."""
    from tokenizers import Tokenizer

    spec = json.loads(tok.backend_tokenizer.to_str())
    spec["pre_tokenizer"] = pre_tokenizer
    spec["normalizer"] = normalizer
    model = spec["model"]
    top = max([*model["vocab"].values(), *(t["id"] for t in spec.get("added_tokens") or [])])
    for a, b in WHITESPACE_MERGES:
        if a + b not in model["vocab"]:
            top += 1  # past the added tokens' ids too
            model["vocab"][a + b] = top
            model["merges"].append([a, b])
    return Tokenizer.from_str(json.dumps(spec))


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _split(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


@pytest.fixture(scope="module")
def backends(tokenizers):
    tok = tokenizers["chatml"]
    return {"tiny": tok.backend_tokenizer,
            "gpt2-byte-level": _variant(tok, BYTE_LEVEL),
            "qwen2-split-nfc": _variant(tok, _split(QWEN2), {"type": "NFC"}),
            "llama3-split": _variant(tok, _split(LLAMA3))}


def test_split_lines_cuts_only_between_non_whitespace_and_joins_back():
    assert split_lines("a\nb\n\nc \nd\n e\nf") == ["a\n", "b\n\nc \nd\n e\n", "f"]
    assert split_lines("no newline") == ["no newline"]
    assert split_lines("\nx") == ["\nx"] and split_lines("x\n") == ["x\n"]


def test_only_lines_that_can_be_reused_are_cut_out():
    # "rep" repeats between the two new pieces and "known" is tokenized already: each alone; the
    # runs of lines between them stay one text; the first line keeps its piece's added token (5)
    a, b = (5, "a\nrep\nb\nc"), (None, "x\nrep\nknown\ny")
    units = units_of([a, b], True, {(None, "known\n")})
    assert units[a] == [(5, "a\n"), (None, "rep\n"), (None, "b\nc")]
    assert units[b] == [(None, "x\n"), (None, "rep\n"), (None, "known\n"), (None, "y")]
    assert all("".join(t for _, t in us) == p[1] for p, us in units.items())
    alone = (5, "u\nv\nw")
    assert units_of([alone], True, set()) == {alone: [alone]}  # nothing to reuse: the piece whole
    assert units_of([a, b], False, set()) == {a: [a], b: [b]}


@pytest.mark.parametrize("name", ["tiny", "gpt2-byte-level", "qwen2-split-nfc", "llama3-split"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_lines_tokenized_apart_give_the_ids_of_the_whole_text(backends, name, data):
    backend = backends[name]
    assert lines_cut_exactly(backend)
    text = data.draw(texts([]))
    whole = backend.encode(text, add_special_tokens=False).ids
    apart = [i for line in split_lines(text) for i in backend.encode(line, add_special_tokens=False).ids]
    assert apart == whole, split_lines(text)


@pytest.mark.parametrize("name", ["gpt2-byte-level", "qwen2-split-nfc", "llama3-split"])
def test_the_whitespace_merges_make_a_wrong_cut_visible(backends, name):
    r"""Why a cut needs non-whitespace on both sides, and proof the test tokenizers can see a
    wrong one: under GPT-2's expression `\s+(?!\S)` takes " \n" whole at a piece's end, where
    the whole text splits " " from "\n"; under Qwen's and Llama 3's `\s*[\r\n]+` takes a
    newline run whole, so a cut inside one changes the ids."""
    backend = backends[name]
    enc = lambda t: backend.encode(t, add_special_tokens=False).ids  # noqa: E731
    left, run = ("a \n", "b"), ("a\n", "\nb")
    wrong = left if name == "gpt2-byte-level" else run
    assert enc(wrong[0]) + enc(wrong[1]) != enc(wrong[0] + wrong[1])
    assert split_lines("a \nb") == ["a \nb"] and split_lines("a\n\nb") == ["a\n\nb"]


def test_unproven_pre_tokenizers_are_never_cut(tokenizers):
    tok = tokenizers["chatml"]
    byte_level = BYTE_LEVEL
    assert not lines_cut_exactly(_variant(tok, {**byte_level, "add_prefix_space": True}))
    assert not lines_cut_exactly(_variant(tok, byte_level, {"type": "NFKC"}))
    assert not lines_cut_exactly(_variant(tok, _split(QWEN2.replace(r"\s+(?!\S)|", ""))))
    assert not lines_cut_exactly(_variant(tok, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                                                "split": True}))
    assert not lines_cut_exactly(_variant(tok, {"type": "Whitespace"}))


@pytest.mark.parametrize("name", ["chatml", "qwen3", "llama3", "chatml-whitespace-merges"])
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_encode_prompt_with_lines_cut_equals_the_whole_texts_ids(tokenizers, backends, name, data):
    """Through the renderer: pieces between added tokens, then lines; the first line of a piece
    tokenized after its added token. The renderer's own one-time check must never have fired.
    The last case swaps in the tiny tokenizer given WHITESPACE_MERGES, where a wrong cut shows."""
    from rowgrove.gateway.core.render import Renderer

    tok = tokenizers[name.removesuffix("-whitespace-merges")]
    if name.endswith("-whitespace-merges"):  # the same template and added tokens (their ids move up)
        from transformers import PreTrainedTokenizerFast

        base = tok
        tok = PreTrainedTokenizerFast(tokenizer_object=backends["gpt2-byte-level"], eos_token=base.eos_token,
                                      pad_token=base.pad_token, bos_token=base.bos_token, unk_token=base.unk_token)
        tok.chat_template = base.chat_template
    r = Renderer(tok)
    assert r._lines_ok
    added = sorted({t.content for t in tok.added_tokens_decoder.values()})[:6]
    for _ in range(3):  # the cache fills across prompts: later ones reuse earlier lines
        text = data.draw(texts(added))
        assert r.encode_prompt(text) == r._backend.encode(text, add_special_tokens=False).ids
        assert r._pieces_ok is not False
