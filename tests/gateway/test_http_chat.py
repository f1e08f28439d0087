"""Chat completions over real loopback HTTP with the official `openai` SDK (sync, async and
streaming), on all three template variants, checked against the ledger token for token."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai import AsyncOpenAI, OpenAI

from fixtures_http import SPECS, TestEngine, assert_continuation, full_prompt, scripted_engine
from rowgrove.gateway.testing import start_gateway
from rowgrove.toolcalls import format_tool_call

TOOLS = [{
    "type": "function",
    "function": {"name": "get_weather", "description": "weather of a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}]


@pytest.fixture(scope="module", params=SPECS)
def gw(request, tmp_path_factory):
    engine = TestEngine(scripted_engine(request.param))
    with start_gateway(request.param, engine=engine,
                       ledger=tmp_path_factory.mktemp(request.param) / "ledger.db") as handle:
        handle.test_engine = engine
        yield handle


def _client(ro, **kw) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0, **kw)


def _calls(gw, ro):
    return gw.ledger.calls(ro["rollout_id"])


def test_continuations_extend_the_parent_token_for_token(gw):
    ro = gw.create_rollout("g-cont", {"task": "t1"})
    client = _client(ro)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    answers = []
    for turn in range(3):
        r = client.chat.completions.create(model="tiny-served", messages=messages)
        answers.append(r)
        assert r.model == "tiny-served"
        assert r.choices[0].message.content == f"reply {turn + 1}"
        assert r.choices[0].finish_reason == "stop"
        messages = messages + [r.choices[0].message.model_dump(), {"role": "user", "content": f"and {turn}?"}]
    calls = _calls(gw, ro)
    assert [c.id for c in calls] == [r.id for r in answers]
    assert calls[0].root and calls[0].parent_id is None
    for parent, call, r in zip(calls, calls[1:], answers[1:], strict=False):
        assert_continuation(gw.ledger, call, parent)
        assert r.usage.prompt_tokens == call.prompt_len
        assert r.usage.completion_tokens == len(call.sampled_ids)
    # what the engine was asked is exactly the ledger's reconstruction
    assert gw.test_engine.prompts[-1] == full_prompt(gw.ledger, calls[-1])
    lineage = gw.lineage(ro["rollout_id"])
    assert lineage["group_id"] == "g-cont" and lineage["status"] == "open"
    assert [c["parent_id"] for c in lineage["calls"]] == [None, calls[0].id, calls[1].id]
    assert [c["prompt_tokens"] for c in lineage["calls"]] == [c.prompt_len for c in calls]


def test_rewritten_history_starts_a_new_root(gw):
    ro = gw.create_rollout("g-rewrite")
    client = _client(ro)
    messages = [{"role": "user", "content": "long task"}]
    r1 = client.chat.completions.create(model="m", messages=messages)
    messages += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]
    r2 = client.chat.completions.create(model="m", messages=messages)
    compacted = [{"role": "user", "content": "summary: long task, replied twice"},
                 {"role": "assistant", "content": "ok (compacted)"}, {"role": "user", "content": "finish"}]
    r3 = client.chat.completions.create(model="m", messages=compacted)
    c1, c2, c3 = _calls(gw, ro)
    assert (c1.id, c2.id, c3.id) == (r1.id, r2.id, r3.id)
    assert c2.parent_id == c1.id
    assert c3.root and c3.parent_id is None
    assert c3.prompt_len == len(c3.prompt_ids) == r3.usage.prompt_tokens


def test_retry_after_a_rejected_response_is_a_sibling(gw):
    ro = gw.create_rollout("g-retry")
    client = _client(ro)
    base = [{"role": "user", "content": "pick a number"}]
    r1 = client.chat.completions.create(model="m", messages=base)
    ask = base + [r1.choices[0].message.model_dump(), {"role": "user", "content": "again"}]
    rejected = client.chat.completions.create(model="m", messages=ask)
    resampled = client.chat.completions.create(model="m", messages=ask)
    assert rejected.id != resampled.id
    c1, c2, c3 = _calls(gw, ro)
    assert c2.parent_id == c1.id and c3.parent_id == c1.id
    assert c2.prompt_ids.tolist() == c3.prompt_ids.tolist()
    # continuing from the resampled answer links to it, not to the rejected one
    more = ask + [resampled.choices[0].message.model_dump(), {"role": "user", "content": "thanks"}]
    r4 = client.chat.completions.create(model="m", messages=more)
    assert gw.ledger.get_call(r4.id).parent_id == c3.id


def test_tool_calls_round_trip(gw):
    ro = gw.create_rollout("g-tools")
    client = _client(ro)
    messages = [{"role": "user", "content": "weather in Paris?"}]
    script = format_tool_call("get_weather", {"city": "Paris"})
    r1 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, tool_choice="auto",
                                        extra_body={"script": script})
    msg = r1.choices[0].message
    assert r1.choices[0].finish_reason == "tool_calls"
    assert msg.content is None
    assert len(msg.tool_calls) == 1
    tc = msg.tool_calls[0]
    assert tc.type == "function" and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    assert tc.id.startswith("call_")
    messages += [msg.model_dump(), {"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21 C"}]
    r2 = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert r2.choices[0].message.content == "reply 2"
    c1, c2 = _calls(gw, ro)
    assert c1.finish_reason == "tool_calls"
    assert_continuation(gw.ledger, c2, c1)
    # the raw sampled tokens decode back to the scripted text (tokens kept, not the parsed form)
    eot = gw.gateway.eot_id
    assert c1.sampled_ids[-1] == eot
    assert gw.gateway.tokenizer.decode(c1.sampled_ids[:-1].tolist(), skip_special_tokens=False) == script


def test_parallel_calls_in_one_rollout_each_find_their_parent(gw):
    ro = gw.create_rollout("g-par")

    async def run():
        client = AsyncOpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        starts = [[{"role": "user", "content": f"sub-agent {k} task"}] for k in range(4)]
        roots = await asyncio.gather(*(client.chat.completions.create(model="m", messages=m) for m in starts))
        follow = [m + [r.choices[0].message.model_dump(), {"role": "user", "content": f"continue {k}"}]
                  for k, (m, r) in enumerate(zip(starts, roots, strict=True))]
        conts = await asyncio.gather(*(client.chat.completions.create(model="m", messages=m) for m in follow))
        await client.close()
        return roots, conts

    roots, conts = asyncio.run(run())
    assert len({r.id for r in roots + conts}) == 8
    for root, cont in zip(roots, conts, strict=True):
        call, parent = gw.ledger.get_call(cont.id), gw.ledger.get_call(root.id)
        assert parent.root
        assert_continuation(gw.ledger, call, parent)


def test_streaming_with_usage_and_logprobs(gw):
    ro = gw.create_rollout("g-stream")
    client = _client(ro)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "stream please"}], stream=True,
        stream_options={"include_usage": True}, logprobs=True, top_logprobs=3,
    )
    chunks = list(stream)
    (call,) = _calls(gw, ro)
    assert {c.id for c in chunks} == {call.id}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "reply 1"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == call.prompt_len
    assert chunks[-1].usage.completion_tokens == len(call.sampled_ids)
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == len(call.sampled_ids)
    assert [e.logprob for e in entries] == pytest.approx(call.logprobs.tolist(), abs=1e-6)
    assert all(len(e.top_logprobs) == 3 for e in entries)


def test_logprobs_one_per_sampled_token_including_end_of_turn(gw):
    ro = gw.create_rollout("g-lp")
    client = _client(ro)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                       logprobs=True, top_logprobs=2, max_tokens=50)
    call = gw.ledger.get_call(r.id)
    content = r.choices[0].logprobs.content
    assert len(content) == len(call.sampled_ids) == r.usage.completion_tokens
    assert [e.logprob for e in content] == pytest.approx(call.logprobs.tolist(), abs=1e-6)
    eot_text = gw.gateway.tokenizer.decode([gw.gateway.eot_id], skip_special_tokens=False)
    assert content[-1].token == eot_text and bytes(content[-1].bytes) == eot_text.encode()
    assert "".join(e.token for e in content[:-1]) == r.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
    # without logprobs requested, none are sent (but the ledger still has them)
    r2 = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi again"}])
    assert r2.choices[0].logprobs is None
    assert len(gw.ledger.get_call(r2.id).logprobs) == r2.usage.completion_tokens


def test_max_tokens_cut_reports_length_and_is_not_a_parent(gw):
    ro = gw.create_rollout("g-len")
    client = _client(ro)
    messages = [{"role": "user", "content": "say a lot"}]
    r = client.chat.completions.create(model="m", messages=messages, max_completion_tokens=1,
                                       extra_body={"script": "one two three four"})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 1
    messages += [r.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
    r2 = client.chat.completions.create(model="m", messages=messages)
    assert gw.ledger.get_call(r2.id).root  # the parent ended without end-of-turn


def test_sdk_retry_gets_the_original_response_and_one_ledger_call(gw):
    ro = gw.create_rollout("g-sdkretry")
    client = _client(ro)
    messages = [{"role": "user", "content": "once only"}]
    r1 = client.chat.completions.create(model="m", messages=messages, logprobs=True)
    r2 = client.chat.completions.create(model="m", messages=messages, logprobs=True,
                                        extra_headers={"x-stainless-retry-count": "1"})
    assert r2.model_dump() == r1.model_dump()
    assert len(_calls(gw, ro)) == 1
    # streamed retries replay too
    s1 = list(client.chat.completions.create(model="m", messages=messages + [
        r1.choices[0].message.model_dump(), {"role": "user", "content": "next"}], stream=True))
    s2 = list(client.chat.completions.create(model="m", messages=messages + [
        r1.choices[0].message.model_dump(), {"role": "user", "content": "next"}], stream=True,
        extra_headers={"x-stainless-retry-count": "2"}))
    assert [c.model_dump() for c in s1] == [c.model_dump() for c in s2]
    assert len(_calls(gw, ro)) == 2
    # the same body without the retry header is a new sample (GRPO resampling), not a replay
    r3 = client.chat.completions.create(model="m", messages=messages, logprobs=True)
    assert r3.id != r1.id and len(_calls(gw, ro)) == 3


def test_sdk_retry_of_an_in_flight_call_waits_for_it(gw):
    ro = gw.create_rollout("g-inflight")
    body = {"model": "m", "messages": [{"role": "user", "content": "slow one"}]}

    async def run():
        client = AsyncOpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
        gw.test_engine.delay = 0.3
        try:
            first = asyncio.ensure_future(client.chat.completions.create(**body))
            await asyncio.sleep(0.1)
            second = await client.chat.completions.create(**body, extra_headers={"x-stainless-retry-count": "1"})
            return await first, second
        finally:
            gw.test_engine.reset()
            await client.close()

    first, second = asyncio.run(run())
    assert first.model_dump() == second.model_dump()
    assert len(_calls(gw, ro)) == 1


def test_template_kwargs_and_sampling_fields_are_accepted(gw):
    ro = gw.create_rollout("g-kw")
    client = _client(ro)
    r = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.7, top_p=0.9, seed=3,
        stop=["zzz"], max_tokens=20, extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].message.content == "reply 1"
    r2 = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                        stop="ply", extra_body={"script": "reply and more"})
    assert r2.choices[0].message.content == "re"  # cut before the stop string, as OpenAI does
    assert r2.choices[0].finish_reason == "stop"
