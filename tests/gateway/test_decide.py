"""decide(): root or continuation, on the tiny model's real tokenizers and chat templates.

A small in-process "gateway" (`Serve`) plays the engine: the sampled ids of each call are the
tokenization of the assistant body the template would render (`format_assistant_text`) plus the
end-of-turn id, and the harness echoes back the assistant message, as an OpenAI client does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowgrove.errors import BadRequest, RowgroveError
from rowgrove.gateway.core import decide as D
from rowgrove.gateway.core.decide import Decision, RolloutIndex, decide, response_message, summary_hashes, validate_messages
from rowgrove.hashing import chain_hashes, chain_start
from rowgrove.toolcalls import ParsedMessage, format_assistant_text

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def assistant(content: str | None = None, calls: list[tuple[str, dict[str, Any], str]] = (), reasoning: str | None = None) -> dict[str, Any]:
    """The assistant message as the harness echoes it back (OpenAI shape, SDK noise included)."""
    m: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": None}
    if calls:
        m["tool_calls"] = [{"id": cid, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                           for name, args, cid in calls]
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    return m


def sampled_for(renderer, msg: dict[str, Any]) -> list[int]:
    """What the engine sampled for `msg`: its body as every shipped template renders it + eot."""
    calls = [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in msg.get("tool_calls") or ()]
    text = format_assistant_text(msg.get("content"), calls, msg.get("reasoning_content"))
    return renderer.tokenizer.encode(text, add_special_tokens=False) + [renderer.end_of_turn_id]


@dataclass
class Serve:
    """Decide, 'generate' the given response, and record the completed call in the index."""

    renderer: Any
    index: RolloutIndex = field(default_factory=RolloutIndex)
    n: int = 0

    def __call__(self, messages, response, *, tools=None, options=None, finish="stop") -> tuple[str, Decision, list[int]]:
        d = decide(self.index, messages, self.renderer, tools=tools, options=options)
        sampled = sampled_for(self.renderer, response)
        if finish == "length":
            sampled = sampled[:-1]
        self.n += 1
        cid = f"c{self.n}"
        summary, _ = summary_hashes(d, response)
        self.index.add_call(cid, summary, d.full_prompt_ids + sampled, parent_id=d.parent_id)
        return cid, d, sampled


def test_continuation_is_parent_context_plus_new_part_token_for_token(renderer):
    serve = Serve(renderer)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "weather in Paris?"}]
    a1 = assistant(None, [("get_weather", {"city": "Paris"}, "call_1")])
    c1, d1, s1 = serve(msgs, a1, tools=TOOLS)
    assert d1.root and d1.reason == D.NO_ASSISTANT
    assert d1.prompt_ids == d1.full_prompt_ids == renderer.render_root(msgs, TOOLS)

    msgs2 = msgs + [a1, {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    a2 = assistant("It is sunny.")
    c2, d2, s2 = serve(msgs2, a2, tools=TOOLS)
    assert (d2.parent_id, d2.reason) == (c1, D.CONTINUATION)
    # token-exact: the engine's prompt is the template's own rendering of the whole request
    assert not d2.drift and renderer.decode(d2.full_prompt_ids) == renderer.render_text(msgs2, TOOLS)
    assert d2.context_text == renderer.render_text(msgs2, TOOLS)
    assert d2.full_prompt_ids == d1.full_prompt_ids + s1 + d2.prompt_ids
    assert s1[-1] == renderer.end_of_turn_id

    msgs3 = msgs2 + [a2, {"role": "user", "content": "and tomorrow?"}]
    _, d3, _ = serve(msgs3, assistant("Rain."), tools=TOOLS)
    assert d3.parent_id == c2
    assert d3.full_prompt_ids == d2.full_prompt_ids + s2 + d3.prompt_ids
    assert np.array_equal(serve.index.context(c2), d2.full_prompt_ids + s2)
    # the new part holds only the glue, the new message and the generation prompt
    text = renderer.tokenizer.decode(d3.prompt_ids, skip_special_tokens=False)
    assert "and tomorrow?" in text and "Rain" not in text and "sunny" not in text


# -- the property: continuation == the template's own full rendering (prefix-stable templates) --

_TEXT = st.text(alphabet="abcdefghij klmnop QRST 0123 .,!?\n", min_size=1, max_size=24).filter(
    lambda s: not s[0].isspace())


@st.composite
def conversations(draw):
    """(system or None, tools or None, turns): each turn is (assistant message, the user/tool
    messages that follow it). Tool calls are answered by 1..3 tool messages in a row, sometimes
    followed by a user message."""
    system = draw(st.one_of(st.none(), _TEXT))
    tools = draw(st.sampled_from([None, TOOLS]))
    first = draw(_TEXT)
    turns = []
    for t in range(draw(st.integers(1, 5))):
        n_calls = draw(st.integers(0, 3))
        calls = [("get_weather", {"city": draw(_TEXT)}, f"call_{t}_{k}") for k in range(n_calls)]
        content = draw(st.one_of(st.none(), _TEXT)) if calls else draw(_TEXT)
        reasoning = draw(st.one_of(st.none(), _TEXT))
        msg = assistant(content, calls, reasoning)
        after = [{"role": "tool", "tool_call_id": cid, "content": draw(_TEXT)} for _, _, cid in calls]
        if not calls or draw(st.booleans()):
            after.append({"role": "user", "content": draw(_TEXT)})
        turns.append((msg, after))
    return system, tools, first, turns


@pytest.mark.parametrize("variant", ["chatml", "llama3"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conv=conversations())
def test_property_incremental_continuation_equals_full_rendering(renderers, variant, conv):
    renderer = renderers[variant]
    system, tools, first, turns = conv
    serve = Serve(renderer)
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": first}]
    for k, (reply, after) in enumerate(turns):
        cid, d, _ = serve(list(msgs), reply, tools=tools)
        assert d.full_prompt_ids == renderer.render_root(msgs, tools), f"call {k + 1} differs from the full rendering"
        assert d.reason == (D.NO_ASSISTANT if k == 0 else D.CONTINUATION)
        assert d.parent_id == (None if k == 0 else f"c{k}")
        msgs += [reply, *after]
    _, d, _ = serve(list(msgs), assistant("done"), tools=tools)
    assert d.full_prompt_ids == renderer.render_root(msgs, tools)
    assert d.parent_id == f"c{len(turns)}"


# -- qwen3: the parent's <think> tokens are kept although the template would strip them ----------

def test_qwen3_continuation_keeps_parent_reasoning_the_full_rendering_strips(renderers):
    renderer = renderers["qwen3"]
    tok = renderer.tokenizer
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "what is 2+2?"}]
    a1 = assistant("4", reasoning="two plus two is four")
    c1, d1, s1 = serve(msgs, a1)
    msgs2 = msgs + [a1, {"role": "user", "content": "and 3+3?"}]
    c2, d2, _ = serve(msgs2, assistant("6"))
    assert d2.parent_id == c1
    full = renderer.render_root(msgs2)
    cont = d2.full_prompt_ids
    think = tok.convert_tokens_to_ids("<think>")
    assert think in s1 and think in cont and think not in full
    assert cont != full
    # They differ exactly in the parent's sampled turn: the kept reasoning vs its stripped rendering.
    p = len(d1.full_prompt_ids)
    stripped = tok.encode("4", add_special_tokens=False) + [renderer.end_of_turn_id]
    assert cont[:p] == full[:p]
    assert cont[p:p + len(s1)] == s1
    assert full[p:p + len(stripped)] == stripped
    assert cont[p + len(s1):] == full[p + len(stripped):] == d2.prompt_ids


def test_qwen3_tool_round_keeps_reasoning_and_matches_full_rendering(renderers):
    """After a tool result (no new user query) Qwen3 keeps the reasoning, so here the continuation
    equals the full rendering."""
    renderer = renderers["qwen3"]
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    a1 = assistant(None, [("get_weather", {"city": "Oslo"}, "call_9")], reasoning="I should call the tool")
    c1, _, _ = serve(msgs, a1, tools=TOOLS)
    msgs2 = msgs + [a1, {"role": "tool", "tool_call_id": "call_9", "content": "snow"}]
    _, d2, _ = serve(msgs2, assistant("Snow."), tools=TOOLS)
    assert d2.parent_id == c1
    assert d2.full_prompt_ids == renderer.render_root(msgs2, TOOLS)


def test_qwen3_enable_thinking_false_is_part_of_every_new_part(renderers):
    """With enable_thinking=false each generation prompt closes an empty think block; the parent's
    prompt keeps its own (which the full rendering of the history would not show)."""
    renderer = renderers["qwen3"]
    serve = Serve(renderer)
    opts = {"enable_thinking": False}
    msgs = [{"role": "user", "content": "hi"}]
    a1 = assistant("hello")
    c1, d1, s1 = serve(msgs, a1, options=opts)
    msgs2 = msgs + [a1, {"role": "user", "content": "bye"}]
    _, d2, _ = serve(msgs2, assistant("bye"), options=opts)
    assert d2.parent_id == c1
    decode = renderer.tokenizer.decode
    assert decode(d1.prompt_ids).endswith("<think>\n\n</think>\n\n")
    assert decode(d2.prompt_ids).endswith("<think>\n\n</think>\n\n")
    assert d2.full_prompt_ids == d1.full_prompt_ids + s1 + d2.prompt_ids


# -- roots ------------------------------------------------------------------------------------------

def _two_calls(renderer, tools=None):
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "hello"}]
    a1 = assistant("hi, how can I help?")
    c1, _, _ = serve(msgs, a1, tools=tools)
    msgs2 = msgs + [a1, {"role": "user", "content": "tell me a joke"}]
    a2 = assistant("no")
    c2, d2, _ = serve(msgs2, a2, tools=tools)
    assert d2.parent_id == c1
    return serve, msgs2 + [a2], (c1, c2)


def test_rewritten_history_starts_a_root(renderer):
    serve, msgs, _ = _two_calls(renderer)
    follow = {"role": "user", "content": "another"}
    edited = [dict(msgs[0], content="HELLO")] + msgs[1:] + [follow]
    d = decide(serve.index, edited, renderer)
    assert (d.parent_id, d.reason) == (None, D.REWRITTEN)
    assert d.prompt_ids == d.full_prompt_ids == renderer.render_root(edited)
    # an assistant turn the model never produced (e.g. a summary) is a rewrite too
    summary = [msgs[0], assistant("summary: user wants a joke"), follow]
    assert decide(serve.index, summary, renderer).reason == D.REWRITTEN
    # a compaction to a single user message has no assistant at all
    assert decide(serve.index, [{"role": "user", "content": "summary so far"}], renderer).reason == D.NO_ASSISTANT


def test_dropped_tool_round_starts_a_root(renderer):
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "weather?"}]
    a1 = assistant(None, [("get_weather", {"city": "Rome"}, "call_1")])
    serve(msgs, a1, tools=TOOLS)
    msgs2 = msgs + [a1, {"role": "tool", "tool_call_id": "call_1", "content": "hot"}]
    a2 = assistant("It is hot.")
    c2, d2, _ = serve(msgs2, a2, tools=TOOLS)
    assert not d2.root
    kept = msgs + [a2, {"role": "user", "content": "thanks"}]  # the tool round dropped
    d = decide(serve.index, kept, renderer, tools=TOOLS)
    assert (d.parent_id, d.reason) == (None, D.REWRITTEN)
    d = decide(serve.index, msgs2 + [a2, {"role": "user", "content": "thanks"}], renderer, tools=TOOLS)
    assert d.parent_id == c2


def test_retry_after_rejected_response_gets_the_rejected_calls_parent(renderer):
    serve, msgs, (c1, c2) = _two_calls(renderer)
    request = msgs[:-1]  # the harness rejects c2's answer and asks again
    c3, d3, _ = serve(request, assistant("why did the chicken cross the road?"))
    assert d3.parent_id == c1
    # continuing from the accepted retry links to it, not to the rejected call
    accepted = request + [assistant("why did the chicken cross the road?"), {"role": "user", "content": "why?"}]
    assert decide(serve.index, accepted, renderer).parent_id == c3


def test_identical_retries_pick_the_most_recent(renderer):
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "hello"}]
    a = assistant("same answer")
    ids = [serve(msgs, a)[0] for _ in range(3)]
    nxt = msgs + [a, {"role": "user", "content": "go on"}]
    d = decide(serve.index, nxt, renderer)
    assert serve.index.candidates(d.chain[1].hex()) == ids
    assert d.parent_id == ids[-1]


def test_two_rollouts_never_link(renderer):
    one, msgs, _ = _two_calls(renderer)
    other = RolloutIndex()
    follow = msgs + [{"role": "user", "content": "more"}]
    assert decide(one.index, follow, renderer).parent_id is not None
    d = decide(other, follow, renderer)
    assert (d.parent_id, d.reason) == (None, D.REWRITTEN)


def test_changed_tools_or_options_start_a_root(renderer):
    serve, msgs, _ = _two_calls(renderer)
    follow = msgs + [{"role": "user", "content": "more"}]
    assert decide(serve.index, follow, renderer).parent_id is not None
    assert decide(serve.index, follow, renderer, tools=TOOLS).reason == D.REWRITTEN
    assert decide(serve.index, follow, renderer, options={"enable_thinking": False}).reason == D.REWRITTEN


def test_parent_finished_by_length_starts_a_root(renderer):
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "hello"}]
    a1 = assistant("cut short")
    c1, _, s1 = serve(msgs, a1, finish="length")
    assert s1[-1] != renderer.end_of_turn_id
    d = decide(serve.index, msgs + [a1, {"role": "user", "content": "go on"}], renderer)
    assert (d.parent_id, d.reason) == (None, D.PARENT_NO_EOT)


def test_other_shapes_after_the_last_assistant_are_roots(renderer):
    serve, msgs, _ = _two_calls(renderer)
    d = decide(serve.index, msgs + [{"role": "system", "content": "new rules"}], renderer)
    assert d.reason == D.NOT_USER_OR_TOOL
    d = decide(serve.index, msgs, renderer)  # ends with the assistant message itself
    assert d.reason == D.ENDS_WITH_ASSISTANT


def test_concurrent_branches_each_find_their_own_parent(renderer):
    """Two sub-agent branches share a root; calls interleave; nothing assumes "the previous call"."""
    serve = Serve(renderer)
    base = [{"role": "user", "content": "plan"}]
    a0 = assistant("two tasks")
    c0, _, _ = serve(base, a0)
    left = base + [a0, {"role": "user", "content": "task left"}]
    right = base + [a0, {"role": "user", "content": "task right"}]
    dl = decide(serve.index, left, renderer)
    dr = decide(serve.index, right, renderer)  # decided before the left call completes
    assert dl.parent_id == dr.parent_id == c0
    al, ar = assistant("left done"), assistant("right done")
    cl, _, _ = serve(left, al)
    cr, _, _ = serve(right, ar)
    assert decide(serve.index, left + [al, {"role": "user", "content": "next"}], renderer).parent_id == cl
    assert decide(serve.index, right + [ar, {"role": "user", "content": "next"}], renderer).parent_id == cr


def _patched(renderer, old: str, new: str):
    """A Renderer over a copy of `renderer`'s tokenizer whose template has `old` replaced by `new`."""
    import copy

    from rowgrove.gateway.core.render import Renderer

    tok = copy.deepcopy(renderer.tokenizer)
    assert old in tok.chat_template, "the template changed: update this test's patch"
    tok.chat_template = tok.chat_template.replace(old, new)
    return Renderer(tok)


def test_history_dependent_template_continues_exactly(renderers):
    """A template that numbers every turn renders the new part differently after each history: the
    new part is read from the whole request's rendering, so the continuation is still exact."""
    renderer = _patched(renderers["chatml"],
                        "{{- '<|im_start|>' + message.role + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}",
                        "{{- '<|im_start|>' + message.role + ' ' + (loop.index | string) + '\\n' + render_content(message.content) + '<|im_end|>\\n' -}}")
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "hello"}]
    a1 = assistant("hi")
    c1, _, _ = serve(msgs, a1)
    msgs2 = msgs + [a1, {"role": "user", "content": "again"}]
    d = decide(serve.index, msgs2, renderer)
    assert (d.parent_id, d.reason, d.drift) == (c1, D.CONTINUATION, False)
    assert renderer.decode(d.full_prompt_ids) == renderer.render_text(msgs2)
    assert "user 3" in renderer.decode(d.prompt_ids)


def test_history_rewriting_template_keeps_the_sampled_tokens_as_drift(renderers):
    """A template that renders a past assistant turn differently from what the model sampled: the
    parent's tokens stay, the new part is the template's, and the call is counted as drift."""
    renderer = _patched(renderers["chatml"], "{{- content -}}\n        {%- if message.tool_calls -%}",
                        "{{- content if loop.last else content | upper -}}\n        {%- if message.tool_calls -%}")
    serve = Serve(renderer)
    msgs = [{"role": "user", "content": "hello"}]
    a1 = assistant("hi there")
    c1, d1, s1 = serve(msgs, a1)
    msgs2 = msgs + [a1, {"role": "user", "content": "again"}]
    d = decide(serve.index, msgs2, renderer)
    assert (d.parent_id, d.reason, d.drift) == (c1, D.CONTINUATION, True)
    assert d.full_prompt_ids[: len(d1.full_prompt_ids) + len(s1)] == d1.full_prompt_ids + s1
    full = renderer.render_text(msgs2)
    assert "HI THERE" in full and full.endswith(renderer.decode(d.prompt_ids))


# -- hashing ----------------------------------------------------------------------------------------

def test_chain_equals_reference_and_memo_sees_edits(renderer):
    index = RolloutIndex()
    msgs = [{"role": "user", "content": "a"}, assistant("b"), {"role": "user", "content": "c"}]
    h0 = chain_start(TOOLS, {"x": 1})
    assert index.chain(msgs, h0) == chain_hashes(msgs, h0)
    assert index.chain(msgs, h0) == chain_hashes(msgs, h0)  # memo hit
    msgs[0]["content"] = "A"  # edited in place: the memo keys on the message's bytes, not identity
    assert index.chain(msgs, h0) == chain_hashes(msgs, h0)
    # SDK noise does not change the chain
    noisy = [dict(m, refusal=None) if m["role"] == "assistant" else m for m in msgs]
    assert index.chain(noisy, h0) == chain_hashes(msgs, h0)


_POOL = [{"role": "user", "content": "u1"}, {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a1"},
         {"role": "assistant", "content": "a2", "refusal": None}, {"role": "system", "content": "s"},
         {"role": "user", "content": [{"type": "text", "text": "u1"}]}]


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["extend", "branch", "edit", "same"]), st.integers(0, 50),
                              st.lists(st.integers(0, len(_POOL) - 1), min_size=1, max_size=3),
                              st.booleans()), min_size=1, max_size=12))
def test_property_memoized_chain_equals_reference(ops):
    """Whatever the sequence of requests (extensions, branches from older requests, in-place edits,
    repeats, changed tools), the memoized chain equals hashing every message from scratch."""
    index = RolloutIndex()
    history: list[list[dict]] = [[dict(_POOL[0])]]
    for kind, at, picks, tools in ops:
        prev = history[-1] if kind != "branch" else history[at % len(history)]
        if kind == "same":
            req = list(prev)
        elif kind == "edit":
            req = list(prev)
            req[at % len(req)]["content"] = f"edited {at}"  # in place: the same dict objects change
        else:
            req = prev[: max(1, at % (len(prev) + 1))] + [dict(_POOL[p]) for p in picks]
        h0 = chain_start(TOOLS if tools else None, None)
        assert index.chain(req, h0) == chain_hashes(req, h0)
        history.append(req)


def test_memo_hit_still_checks_tool_call_ids():
    index = RolloutIndex()
    h0 = chain_start(None, None)
    good = [{"role": "user", "content": "q"}, assistant(None, [("f", {}, "call_a")]),
            {"role": "tool", "tool_call_id": "call_a", "content": "r"}]
    index.chain(good, h0)
    renamed = [good[0], assistant(None, [("f", {}, "call_b")]), good[2]]  # same hash: ids are ignored
    with pytest.raises(BadRequest, match="call_a"):
        index.chain(renamed, h0)


# -- validation -------------------------------------------------------------------------------------

@pytest.mark.parametrize("messages, match", [
    (None, "non-empty list"),
    ([], "non-empty list"),
    ({"role": "user"}, "non-empty list"),
    (["hello"], r"messages\[0\]: .*object with a 'role', got str"),
    ([{"role": "bot", "content": "x"}], r"messages\[0\]: unknown role 'bot'"),
    ([{"content": "x"}], r"unknown role None"),
    ([{"role": "user", "content": 5}], r"content must be a string, null or a list"),
    ([{"role": "user"}], r"a user message needs content"),
    ([{"role": "user", "content": [{"text": "x"}]}], r'content\[0\] must be an object with a "type"'),
    ([{"role": "user", "content": [{"type": "text", "text": 3}]}], r"without a string 'text'"),
    ([{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}],
     r"messages\[1\]: tool_call_id 'call_1' matches no tool call"),
    ([{"role": "tool", "content": "r"}], r"needs the tool_call_id"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": {"id": "a"}}], r"tool_calls must be a list"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     r"tool_calls\[0\]\.id must be a non-empty string"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {}}}]}],
     r"arguments must be a JSON string"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "a", "function": {"arguments": "{}"}}]}],
     r"function\.name must be a non-empty string"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "a", "type": "tool", "function": {"name": "f", "arguments": "{}"}}]}],
     r'type must be "function"'),
    ([{"role": "user", "content": "x", "tool_calls": []}], r"only assistant messages carry tool_calls"),
    ([{"role": "user", "content": "x", "name": 1}], r"name must be a string"),
])
def test_validate_messages_refuses_with_a_clear_message(messages, match):
    with pytest.raises(BadRequest, match=match) as e:
        validate_messages(messages)
    assert e.value.param == "messages"


def test_validate_messages_accepts_openai_shapes():
    validate_messages([
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
        assistant(None, [("get_weather", {"city": "Oslo"}, "call_1"), ("get_weather", {"city": "Rome"}, "call_2")]),
        {"role": "tool", "tool_call_id": "call_1", "content": "cold"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "hot"}]},
        assistant("done", reasoning="both answered"),
    ], TOOLS)


@pytest.mark.parametrize("tools, match", [
    ({"type": "function"}, "tools must be a list"),
    ([{"type": "function"}], r"tools\[0\] must be"),
    ([{"type": "function", "function": {"description": "x"}}], r"tools\[0\]\.function\.name"),
])
def test_validate_tools(tools, match):
    with pytest.raises(BadRequest, match=match) as e:
        validate_messages([{"role": "user", "content": "x"}], tools)
    assert e.value.param == "tools"


def test_decide_validates_too(renderer):
    with pytest.raises(BadRequest, match=r"messages\[1\]: unknown role"):
        decide(RolloutIndex(), [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}], renderer)


# -- index: rebuild from the ledger, segments ---------------------------------------------------------

def test_from_calls_rebuild_equals_live_index(renderers, tmp_path):
    """Live index vs one rebuilt from a real SQLite ledger: same candidates, same contexts; pending
    and failed calls are left out."""
    from rowgrove.ledger import Ledger

    renderer = renderers["chatml"]
    ledger = Ledger(tmp_path / "ledger.db")
    ro = ledger.create_rollout("g")
    live = RolloutIndex()

    def call(messages, reply, *, finish="stop"):
        d = decide(live, messages, renderer, tools=TOOLS)
        c = ledger.begin_call(ro.id, parent_id=d.parent_id, prompt_ids=d.prompt_ids,
                              prompt_len=len(d.full_prompt_ids), request_hash=d.request_hash)
        sampled = sampled_for(renderer, reply)
        summary, resp_hash = summary_hashes(d, reply)
        ledger.complete_call(c.id, sampled_ids=sampled, logprobs=[0.0] * len(sampled), finish_reason=finish,
                             summary_hash=summary, response_hash=resp_hash, response=None)
        live.add_call(c.id, summary, d.full_prompt_ids + sampled, parent_id=d.parent_id)
        return c.id, d

    msgs = [{"role": "user", "content": "weather?"}]
    a1 = assistant(None, [("get_weather", {"city": "Rome"}, "call_1")])
    call(msgs, a1)
    m2 = msgs + [a1, {"role": "tool", "tool_call_id": "call_1", "content": "hot"}]
    a2 = assistant("hot")
    call(m2, a2)
    call(m2, assistant("warm"))  # a retry: sibling of the rejected call
    m3 = m2 + [a2, {"role": "user", "content": "more"}]
    for k in range(6):  # more calls than RECENT_CONTEXTS, so segments are walked too
        a = assistant(f"more {k}")
        call(m3, a)
        m3 = m3 + [a, {"role": "user", "content": f"again {k}"}]
    call([{"role": "user", "content": "compacted"}], assistant("ok"))  # a second root
    pending = ledger.begin_call(ro.id, parent_id=None, prompt_ids=[1, 2], prompt_len=2, request_hash="00")
    failed = ledger.begin_call(ro.id, parent_id=None, prompt_ids=[1, 2], prompt_len=2, request_hash="00")
    ledger.end_call(failed.id, "failed", "engine died")

    calls = ledger.calls(ro.id)
    rebuilt = RolloutIndex.from_calls(reversed(calls))
    completed = [c for c in calls if c.status == "completed"]
    assert len(rebuilt) == len(live) == len(completed) == 10
    assert pending.id not in rebuilt and failed.id not in rebuilt
    for c in completed:
        assert np.array_equal(rebuilt.context(c.id), live.context(c.id)), c.id
        assert rebuilt.candidates(c.summary_hash) == live.candidates(c.summary_hash)
        assert len(rebuilt.context(c.id)) == c.prompt_len + len(c.sampled_ids)
    follow = m3[:-1] + [{"role": "user", "content": "after restart"}]
    assert decide(rebuilt, follow, renderer, tools=TOOLS).full_prompt_ids == decide(live, follow, renderer, tools=TOOLS).full_prompt_ids
    ledger.close()


def test_index_stores_segments_and_rebuilds_old_contexts():
    index = RolloutIndex()
    index.add_call("r", "s0", [1, 2, 3, 9])
    ctx = [1, 2, 3, 9]
    for k in range(1, 10):
        ctx = ctx + [10 + k, 9]
        index.add_call(f"k{k}", f"s{k}", np.asarray(ctx), parent_id="r" if k == 1 else f"k{k - 1}")
    assert index._nodes["k9"].segment.tolist() == [19, 9]  # only what it added
    assert index.context("k1").tolist() == [1, 2, 3, 9, 11, 9]  # evicted from the recent cache
    assert index.context_list("k9") == ctx
    assert index.last_token("k5") == 9
    # a context that does not extend the claimed parent is stored whole
    index.add_call("odd", "sx", [5, 5], parent_id="k9")
    assert index.context("odd").tolist() == [5, 5]
    with pytest.raises(RowgroveError, match="already in the rollout index"):
        index.add_call("odd", "sx", [5, 5])


def test_response_message_from_parsed():
    tc = {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    msg = response_message(ParsedMessage(content=None, tool_calls=[tc], reasoning="hm"))
    assert msg == {"role": "assistant", "content": None, "tool_calls": [tc], "reasoning_content": "hm"}
    assert response_message(ParsedMessage(content=None)) == {"role": "assistant", "content": ""}
    relabeled = response_message(ParsedMessage(content="ok", tool_calls=[tc]), "chatcmpl-1")
    assert relabeled["tool_calls"][0]["id"].startswith("call_") and relabeled["tool_calls"][0]["id"] != "call_x"
    assert tc["id"] == "call_x"  # the parsed message is not mutated


def test_a_requests_images_are_hashed_by_the_digests_its_edge_resolved_never_read_again(monkeypatch):
    """decide's chain (and the kept-image check's blind hash) take each image part's pixel digest
    from the request's RequestImages: rowgrove.media is never asked, and the hash is the one a
    record's message gets when its URL names those pixels (reassembly matches it)."""
    import rowgrove.media as media
    from rowgrove.gateway.core.decide import RolloutIndex
    from rowgrove.gateway.core.messages import RequestImages
    from rowgrove.hashing import blind_message_hash, chain_hashes, chain_start

    def refuse(*a, **k):
        raise AssertionError("media read during hashing")

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    msgs = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    stored = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                           {"type": "image_url", "image_url": {"url": "rowgrove-media:sha256:abc"}}]}]
    h0 = chain_start(None, None)
    want, want_blind = chain_hashes(stored, h0), blind_message_hash(stored[0])  # a record's message
    monkeypatch.setattr(media, "digest_of_url", refuse)
    monkeypatch.setattr(media, "load_url", refuse)
    assert RolloutIndex().chain(msgs, h0, RequestImages([], {(0, 1): "sha256:abc"})) == want
    assert blind_message_hash(msgs[0]) == want_blind
