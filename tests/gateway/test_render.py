"""Renderer: root prompts equal the template's own tokenization; the continuation part is what the
template writes after an assistant turn's end-of-turn, and is refused (None) whenever the checks
that make it safe fail."""

from __future__ import annotations

import copy

import pytest

from rowgrove.errors import BadRequest, InputError
from rowgrove.gateway.render import Renderer

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
CONV = [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "find x"},
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "x=1"},
]


def _variant_tokenizer(renderer, old: str, new: str):
    tok = copy.deepcopy(renderer.tokenizer)
    assert old in tok.chat_template, "the template changed: update this test's patch"
    tok.chat_template = tok.chat_template.replace(old, new)
    return tok


def test_end_of_turn_ids(renderers):
    assert {n: r.end_of_turn_text for n, r in renderers.items()} == {
        "chatml": "<|im_end|>", "qwen3": "<|im_end|>", "llama3": "<|eot_id|>"}
    for r in renderers.values():
        assert r.tokenizer.encode(r.end_of_turn_text, add_special_tokens=False) == [r.end_of_turn_id]


def test_render_root_is_the_templates_own_tokenization(renderer):
    for tools in (None, TOOLS):
        want = renderer.tokenizer.apply_chat_template(CONV, tools=tools, add_generation_prompt=True,
                                                      tokenize=True, return_dict=False)
        assert renderer.render_root(CONV, tools) == list(want)
    bos = renderer.tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert renderer.render_root(CONV).count(bos) == (1 if renderer.end_of_turn_text == "<|eot_id|>" else 0)


@pytest.mark.parametrize("variant, glue", [("chatml", "\n"), ("qwen3", "\n"), ("llama3", "")])
def test_continuation_part_is_glue_new_messages_and_generation_prompt(renderers, variant, glue):
    r = renderers[variant]
    new = [{"role": "tool", "tool_call_id": "c1", "content": "x=1"}, {"role": "tool", "tool_call_id": "c2", "content": "y=2"}]
    ids = r.render_continuation(new, TOOLS)
    text = r.tokenizer.decode(ids, skip_special_tokens=False)
    gen = r.render_text([{"role": "user", "content": "u"}], add_generation_prompt=True)
    gen = gen[len(r.render_text([{"role": "user", "content": "u"}], add_generation_prompt=False)):]
    assert text.startswith(glue) and text.endswith(gen)
    assert text.index("x=1") < text.index("y=2")
    assert "sys" not in text and "lookup" not in text  # system and tools live in the root only
    # the same as the full rendering's tail after the parent's end-of-turn (prefix-stable here)
    if variant != "qwen3":
        full = r.render_root(CONV[:3] + new, TOOLS)
        assert full[-len(ids):] == ids
        assert full[-len(ids) - 1] == r.end_of_turn_id


def test_continuation_with_options(renderers):
    r = renderers["qwen3"]
    user = [{"role": "user", "content": "hi"}]
    plain = r.tokenizer.decode(r.render_continuation(user))
    closed = r.tokenizer.decode(r.render_continuation(user, options={"enable_thinking": False}))
    assert closed == plain + "<think>\n\n</think>\n\n"


def test_empty_or_reserved_gives_none_and_root_refuses(renderer):
    assert renderer.render_continuation([]) is None
    assert renderer.render_continuation([{"role": "user", "content": "x"}], options={"tokenize": True}) is None
    with pytest.raises(BadRequest, match="may not set tokenize") as e:
        renderer.render_root([{"role": "user", "content": "x"}], options={"tokenize": True})
    assert e.value.param == "chat_template_kwargs"


def test_template_errors_are_bad_requests(renderer):
    with pytest.raises(BadRequest, match="cannot render") as e:
        renderer.render_root([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}])
    assert e.value.param == "messages"
    # the continuation path returns None (a root then raises the same error for the caller)
    assert renderer.render_continuation([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]) is None


def test_history_dependent_new_part_is_refused(renderers):
    """A template that numbers user turns renders the new part differently after each probe."""
    r = renderers["chatml"]
    tok = _variant_tokenizer(
        r, "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}",
        "{{- '<|im_start|>' + message.role + ' ' + (loop.index | string) + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}")
    numbered = Renderer(tok)
    assert numbered.render_continuation([{"role": "user", "content": "x"}]) is None
    # tool messages are not numbered in this template: their shape passes the probe check
    assert numbered.render_continuation([{"role": "tool", "tool_call_id": "c1", "content": "r"}]) is not None


def test_history_rewriting_before_the_boundary_is_refused(renderers):
    """A template that renders an assistant turn differently once something follows it breaks the
    probe's prefix: the parent's tokens could not be extended consistently."""
    r = renderers["chatml"]
    tok = _variant_tokenizer(
        r, "{{- content -}}\n        {%- if message.tool_calls -%}",
        "{{- content if loop.last else content | upper -}}\n        {%- if message.tool_calls -%}")
    rewriting = Renderer(tok)
    assert rewriting.render_continuation([{"role": "user", "content": "x"}]) is None


def test_an_end_of_turn_the_template_does_not_write_is_refused(renderers):
    """With an end-of-turn id the template never writes after an assistant turn, no boundary can
    be found: every continuation is refused (the gateway then renders roots)."""
    r = renderers["chatml"]
    weird = Renderer(r.tokenizer, end_of_turn_id=r.tokenizer.convert_tokens_to_ids("<|im_start|>"))
    assert weird.render_continuation([{"role": "user", "content": "x"}]) is None
    text_eot = Renderer(r.tokenizer, end_of_turn_id=r.tokenizer.encode("a", add_special_tokens=False)[0])
    assert text_eot.render_continuation([{"role": "user", "content": "x"}]) is None


def test_a_tokenizer_without_template_is_refused(renderers):
    tok = copy.deepcopy(renderers["chatml"].tokenizer)
    tok.chat_template = None
    with pytest.raises(InputError, match="no chat template"):
        Renderer(tok)


def test_new_part_only_tokenization_equals_whole_probe_tokenization(renderer):
    """The fast path (tokenize end-of-turn + new part once a shape is checked) gives the ids the
    whole probe rendering gives."""
    slow = Renderer(renderer.tokenizer, end_of_turn_id=renderer.end_of_turn_id)
    slow._eot_splits = False
    assert renderer._eot_splits
    news = [
        [{"role": "user", "content": "plain"}],
        [{"role": "user", "content": " leading space and trailing \n"}],
        [{"role": "tool", "tool_call_id": "c1", "content": "{\"x\": 1}"}, {"role": "user", "content": "ok"}],
        [{"role": "user", "content": [{"type": "text", "text": "parts"}, {"type": "text", "text": " two"}]}],
    ]
    for tools in (None, TOOLS):
        for new in news:
            for _ in range(2):  # the second time takes the fast path
                assert renderer.render_continuation(new, tools) == slow.render_continuation(new, tools) is not None


def test_fast_render_equals_apply_chat_template_and_is_trusted_only_after_it_matched(tokenizers):
    from hypothesis import given, settings
    from hypothesis import strategies as st

    for tok in tokenizers.values():
        r = Renderer(tok)
        text = st.text(alphabet=st.sampled_from("ab <>{}\"\n:1"), max_size=12)

        @settings(max_examples=20, deadline=None)
        @given(turns=st.lists(st.tuples(st.sampled_from(["user", "assistant", "tool"]), text), min_size=1, max_size=5),
               tools=st.sampled_from([None, TOOLS]), gen=st.booleans())
        def check(turns, tools, gen):
            msgs = [{"role": "system", "content": "sys"}] + [
                {"role": role, "content": c, **({"tool_call_id": "c1"} if role == "tool" else {})} for role, c in turns]
            want = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=gen, tokenize=False)
            assert r.render_text(msgs, tools, add_generation_prompt=gen) == want  # verified, or checked slow
            assert r.render_text(msgs, tools, add_generation_prompt=gen) == want  # now the fast path
            assert r.render_root(msgs, tools) == tok.encode(
                tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False),
                add_special_tokens=False)

        check()
        assert r._fast_ok and all(r._fast_ok.values())


def test_fast_render_that_disagrees_once_is_never_used(renderers):
    r = Renderer(renderers["chatml"].tokenizer)

    class Wrong:
        def render(self, **kw):
            return "not what the template writes"

    r._template = Wrong()
    msgs = [{"role": "user", "content": "hi"}]
    want = r.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert r.render_text(msgs) == want and r.render_text(msgs) == want
    assert list(r._fast_ok.values()) == [False]
