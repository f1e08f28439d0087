"""Renderer: a root prompt is `apply_chat_template` of the messages prepared as vLLM prepares them;
a continuation's new part is what the template writes after the parent's turn in its rendering
of the whole request (exact), or, where the template re-renders the history, after the located
end of the parent's turn (drift); None when that end cannot be located exactly."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.errors import BadRequest, InputError
from rowgrove.gateway.core.preprocess import OPENAI, STRING, detect_content_format, engine_messages
from rowgrove.gateway.core.render import Renderer

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x", "n": 2}'}}
CONV = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "find x"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "x=1"},
]


def _variant(renderer, old: str, new: str) -> Renderer:
    tok = copy.deepcopy(renderer.tokenizer)
    assert old in tok.chat_template, "the template changed: update this test's patch"
    tok.chat_template = tok.chat_template.replace(old, new)
    return Renderer(tok)


def _apply(tok, msgs, tools=None, gen=True, **opts) -> str:
    return tok.apply_chat_template(engine_messages(msgs), tools=tools, add_generation_prompt=gen, tokenize=False, **opts)


# -- what the template sees ------------------------------------------------------------------------

def test_messages_reach_the_template_as_vllm_prepares_them():
    sdk_dump = {"role": "assistant", "content": None, "refusal": None, "annotations": None, "audio": None,
                "function_call": None, "tool_calls": [CALL], "reasoning_content": "think"}
    (m,) = engine_messages([sdk_dump])
    assert m["content"] == "" and m["tool_calls"][0]["function"]["arguments"] == {"q": "x", "n": 2}
    assert list(m["tool_calls"][0]["function"]["arguments"]) == ["q", "n"]  # the order the model wrote
    assert m["reasoning_content"] == m["reasoning"] == m["thinking"] == "think"
    assert not {"refusal", "annotations", "audio", "function_call"} & set(m)
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert engine_messages([parts])[0]["content"] == "a\nb"
    assert engine_messages([parts], OPENAI)[0]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert engine_messages([{"role": "user", "content": "s"}], OPENAI)[0]["content"] == "s"  # as SGLang passes it
    with pytest.raises(BadRequest, match=r"messages\[0\].tool_calls\[0\].function.arguments is not valid JSON"):
        engine_messages([{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}])
    with pytest.raises(BadRequest, match=r"messages\[0\].content\[0\]: parts of type 'image_url'"):
        engine_messages([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}])


def test_content_format_is_detected_from_the_template_syntax():
    assert detect_content_format("{% for m in messages %}{{ m.content }}{% endfor %}") == STRING
    assert detect_content_format("{% for m in messages %}{% for p in m['content'] %}{{ p.text if p.type == 'text' }}{% endfor %}{% endfor %}") == OPENAI
    assert detect_content_format("{% for m in messages %}{% set c = m.content %}{% for p in c %}{{ p['text'] if p['type'] }}{% endfor %}{% endfor %}") == OPENAI
    # a loop over parts that never asks a part's type gets the string (it would print a repr)
    assert detect_content_format("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}") == STRING
    assert detect_content_format("{% if %}") == STRING  # unparsable: the default


def test_root_is_apply_chat_template_of_the_prepared_messages(renderer):
    for tools in (None, TOOLS):
        want = renderer.tokenizer.encode(_apply(renderer.tokenizer, CONV, tools), add_special_tokens=False)
        assert renderer.render_root(CONV, tools) == want
        root = renderer.root(CONV, tools)
        assert root.ids == want and root.text == _apply(renderer.tokenizer, CONV, tools)
    # the tool call is written as the object the model sampled, never as an escaped string
    assert '"q": "x"' in renderer.render_text(CONV, TOOLS) and '\\"q\\"' not in renderer.render_text(CONV, TOOLS)


def test_tools_render_in_the_order_the_client_sent_them(renderers):
    r = Renderer(renderers["chatml"].tokenizer)
    params = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    one = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": params}}]
    two = [{"function": {"parameters": params, "description": "d", "name": "f"}, "type": "function"}]
    msgs = [{"role": "user", "content": "x"}]
    for _ in range(2):  # the second time the fast path answers: it must still follow each order
        assert r.render_text(msgs, one) == _apply(r.tokenizer, msgs, one)
        assert r.render_text(msgs, two) == _apply(r.tokenizer, msgs, two)
    assert r.render_text(msgs, one) != r.render_text(msgs, two)


# -- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["tokenize", "eos_token", "pad_token", "raise_exception", "messages"])
def test_reserved_options_are_bad_requests(renderer, key):
    with pytest.raises(BadRequest, match=f"may not set {key}") as e:
        renderer.render_root([{"role": "user", "content": "x"}], options={key: "x"})
    assert e.value.param == "chat_template_kwargs"


def test_a_template_that_raises_is_a_bad_request_naming_its_message(renderers):
    r = _variant(renderers["chatml"], "{%- if add_generation_prompt -%}",
                 "{%- if messages | length > 2 -%}{{ raise_exception('only two messages, please') }}{%- endif -%}"
                 "{%- if add_generation_prompt -%}")
    with pytest.raises(BadRequest, match="only two messages, please") as e:
        r.render_root([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])
    assert e.value.param == "messages"
    typed = _variant(renderers["chatml"], "{%- if add_generation_prompt -%}", "{{ 1 + 'a' }}{%- if add_generation_prompt -%}")
    with pytest.raises(BadRequest, match="TypeError"):
        typed.render_root([{"role": "user", "content": "a"}])


def test_a_tokenizer_without_template_is_refused(renderers):
    tok = copy.deepcopy(renderers["chatml"].tokenizer)
    tok.chat_template = None
    with pytest.raises(InputError, match="no chat template"):
        Renderer(tok)


# -- continuations ---------------------------------------------------------------------------------

def _context(r: Renderer, msgs, tools=None):
    """(ids, text) of a parent call: its root prompt + the assistant turn as the template writes it."""
    prompt = r.root(msgs[:-1], tools)
    full = r.render_text(msgs, tools, add_generation_prompt=False)
    assert full.startswith(prompt.text)
    reply = full[len(prompt.text):]
    eot = r.tokenizer.convert_ids_to_tokens(r.end_of_turn_id)
    reply = reply[: reply.index(eot) + len(eot)]
    return prompt.ids + r.encode(reply), prompt.text + reply


_TEXT = st.text(alphabet="abcdefghij klmnop QRST 0123 .,!?\n", min_size=2, max_size=24).filter(
    lambda s: not s[0].isspace() and not s[-1].isspace())


@settings(max_examples=30, deadline=None)
@given(first=_TEXT, reply=_TEXT, new=st.lists(_TEXT, min_size=1, max_size=3), tool=st.booleans(),
       thinking=st.sampled_from([None, {"enable_thinking": False}]))
def test_continuation_prompt_is_the_templates_rendering_of_the_whole_request(renderers, first, reply, new, tool, thinking):
    for name in ("chatml", "llama3"):  # prefix-stable templates: every continuation is exact
        r = renderers[name]
        opts = thinking if name == "chatml" else None
        if tool:
            parent = [{"role": "user", "content": first},
                      {"role": "assistant", "content": None, "tool_calls": [CALL]}]
            tail = [{"role": "tool", "tool_call_id": "c1", "content": t} for t in new]
        else:
            parent = [{"role": "user", "content": first}, {"role": "assistant", "content": reply}]
            tail = [{"role": "user", "content": new[0]}]
        ids, text = _context(r, parent, TOOLS)
        msgs = parent + tail
        cont = r.continuation(msgs, 1, text, ids[-1], TOOLS, opts)
        assert cont is not None and not cont.drift
        whole = r.render_text(msgs, TOOLS, opts)
        assert text + cont.text == whole
        assert ids + cont.ids == r.encode(whole)


def test_qwen3_style_template_drops_earlier_thinking_as_drift(renderers):
    r = renderers["qwen3"]
    parent = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "reasoning_content": "think hard"}]
    ids, text = _context(r, parent)
    assert "think hard" in text
    msgs = parent + [{"role": "user", "content": "q2"}]
    cont = r.continuation(msgs, 1, text, ids[-1])
    assert cont is not None and cont.drift
    whole = r.render_text(msgs)
    assert "think hard" not in whole and whole.endswith(cont.text)
    assert cont.text.startswith("\n<|im_start|>user\nq2")


def test_a_parent_text_the_template_does_not_continue_is_a_root(renderers):
    r = renderers["chatml"]
    parent = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    ids, text = _context(r, parent)
    msgs = parent + [{"role": "user", "content": ""}]  # nothing to locate the boundary by on drift
    assert r.continuation(msgs, 1, text.replace("a1", "zz"), ids[-1]) is None
    # a parent whose last token is not an added token cannot be cut after
    plain = r.encode("a")[0]
    assert r.continuation(msgs, 1, text, plain) is None


def test_glm_style_next_message_markers_must_be_what_the_model_sampled(renderers):
    """Where the marker that ends a turn opens the next message (it depends on the next role), a
    parent that sampled another marker cannot be continued."""
    r = renderers["chatml"]
    markers, closing = r._turn_markers()
    assert closing and r.end_of_turn_id in dict(markers)


# -- the direct render -----------------------------------------------------------------------------

def test_fast_render_equals_apply_chat_template_and_is_trusted_only_after_it_matched(tokenizers):
    for tok in tokenizers.values():
        r = Renderer(tok)
        text = st.text(alphabet=st.sampled_from("ab <>{}\"\n:1"), max_size=12)

        @settings(max_examples=20, deadline=None)
        @given(turns=st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), text), min_size=1, max_size=5),
               tools=st.sampled_from([None, TOOLS]), gen=st.booleans(), null=st.booleans())
        def check(turns, tools, gen, null):
            msgs = [{"role": "system", "content": "sys"}] + [
                {"role": role, "content": (None if null and role == "assistant" else c),
                 **({"tool_call_id": "c1"} if role == "tool" else {}),
                 **({"tool_calls": None, "refusal": None} if role == "assistant" else {})} for role, c in turns]
            want = _apply(tok, msgs, tools, gen)
            assert r.render_text(msgs, tools, add_generation_prompt=gen) == want  # verified, or checked slow
            assert r.render_text(msgs, tools, add_generation_prompt=gen) == want  # now the fast path
            assert r.render_root(msgs, tools) == tok.encode(_apply(tok, msgs, tools), add_special_tokens=False)

        check()
        verdicts = {**r._fast_ok, **r._fast_verified}  # the jinja2 direct render's, the MiniJinja path's
        assert verdicts and all(verdicts.values())


def test_fast_render_that_disagrees_once_is_never_used(renderers):
    r = Renderer(renderers["chatml"].tokenizer)

    class Wrong:
        def render(self, **kw):
            return "not what the template writes"

    r._template = Wrong()
    r.fast = None  # the jinja2 direct render alone (the MiniJinja path: the next test)
    msgs = [{"role": "user", "content": "hi"}]
    want = _apply(r.tokenizer, msgs)
    assert r.render_text(msgs) == want and r.render_text(msgs) == want
    assert list(r._fast_ok.values()) == [False]


def test_minijinja_path_that_disagrees_once_is_never_used(renderers):
    from rowgrove.gateway.core.incremental import MARK, VMARK

    r = Renderer(renderers["chatml"].tokenizer)
    assert r.fast is not None, r.fast_declined
    calls = []

    class Wrong:
        def render(self, *a, **kw):
            calls.append(1)
            return "not" + MARK + VMARK + VMARK + " what the template writes"

    r.fast = Wrong()
    msgs = [{"role": "user", "content": "hi"}]
    want = _apply(r.tokenizer, msgs)
    assert r.render_text(msgs) == want and r.render_text(msgs) == want
    assert list(r._fast_verified.values()) == [False] and len(calls) == 1


@pytest.mark.parametrize("name", ["chatml", "qwen3", "llama3"])
def test_a_large_root_is_tokenized_piece_by_piece_as_the_whole_text(tokenizers, name):
    """`encode_prompt` on a prompt large enough to go as one threaded batch (encode_batch_fast,
    no offsets), then small and repeated ones: always the ids of tokenizing the whole text."""
    from rowgrove.gateway.core import render

    r = Renderer(tokenizers[name])
    msgs = [{"role": "system", "content": "You are terse. ü 日本 <b>&amp;</b>"}]
    for k in range(300):
        msgs += [{"role": "user", "content": f"line {k}\n  indented\tand 'quoted' \"text\" {k * 7}"},
                 {"role": "assistant", "content": f"answer {k}: done.\n\n"}]
    text = r.render_text(msgs)
    assert len(text) > render._BATCH_CHARS
    want = r.encode(text)
    assert r.encode_prompt(text) == want  # cold: the batch path
    assert r._pieces_ok is True
    assert r.encode_prompt(text) == want  # every piece known
    small = r.render_text(msgs[:3])
    assert r.encode_prompt(small) == r.encode(small)
