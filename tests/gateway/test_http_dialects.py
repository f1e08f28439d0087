"""The Responses API and the Anthropic Messages API on a rollout's base_url, over real loopback
HTTP with the official `openai` and `anthropic` SDKs, on all three template variants.

The promise pinned here: the dialect a harness speaks never changes its calls or rows. One tool
episode (a tool call, its result, a second tool call, its result, the answer) is played over
Chat Completions, over `client.responses.create` (streaming and not) and over
`anthropic.messages.create` (streaming and not); every call continues its parent token for token,
each dialect's engine prompts are the Chat episode's, and the rows are identical token for token.
"""

from __future__ import annotations

import json

import anthropic
import pytest
from openai import OpenAI

from fixtures_http import SPECS, TestEngine, assert_continuation, dump_ledger, full_prompt, scripted_engine
from rowgrove.gateway.testing import start_gateway
from rowgrove.toolcalls import format_assistant_text

INSTRUCTIONS = "You answer weather questions with the tool."
QUESTION = "Weather in Paris and Rome?"
ANSWER = "Sunny in Paris, rain in Rome."
RESULTS = ["sunny, 21 C", "rain, 12 C"]
CITIES = ["Paris", "Rome"]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                                "parameters": PARAMS}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "weather of a city",
                    "parameters": PARAMS}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "weather of a city", "input_schema": PARAMS}]


@pytest.fixture(scope="module", params=SPECS)
def gw(request, tmp_path_factory):
    engine = TestEngine(scripted_engine(request.param))
    with start_gateway(request.param, engine=engine,
                       ledger=tmp_path_factory.mktemp(request.param) / "ledger.db") as handle:
        handle.test_engine = engine
        yield handle


def scripts(gw) -> list[str]:
    """The three sampled texts of the episode: two tool calls (the first with reasoning where the
    family splits it off), then the answer."""
    reasoning = "Paris first." if gw.gateway.reasoning_parser else None
    return [format_assistant_text(tool_calls=[("get_weather", {"city": CITIES[0]})], reasoning=reasoning),
            format_assistant_text(tool_calls=[("get_weather", {"city": CITIES[1]})]),
            ANSWER]


def chat_episode(gw, ro) -> list[dict]:
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    for k, script in enumerate(scripts(gw)):
        r = client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS,
                                           extra_body={"script": script})
        msg = r.choices[0].message.model_dump(exclude_none=True)
        messages.append(msg)
        if k < 2:
            messages.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": RESULTS[k]})
    return messages


def responses_episode(gw, ro, *, stream: bool) -> list[dict]:
    """The episode through `client.responses.create`, the whole input sent each time; returns the
    input items of the whole run (what a Responses harness sends to finish)."""
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    items: list[dict] = [{"role": "user", "content": QUESTION}]
    for k, script in enumerate(scripts(gw)):
        kw = dict(model="m", instructions=INSTRUCTIONS, input=items, tools=RESPONSES_TOOLS,
                  extra_body={"script": script})
        if stream:
            events = list(client.responses.create(stream=True, **kw))
            kinds = [e.type for e in events]
            assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            r = events[-1].response
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert deltas == r.output_text
        else:
            r = client.responses.create(**kw)
        assert r.status == "completed" and r.usage.input_tokens > 0
        output = [o.model_dump(exclude_none=True) for o in r.output]
        items += output
        if k < 2:
            calls = [o for o in r.output if o.type == "function_call"]
            assert [json.loads(c.arguments) for c in calls] == [{"city": CITIES[k]}]
            items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULTS[k]})
        else:
            assert r.output_text == ANSWER
    return items


def anthropic_episode(gw, ro, *, stream: bool) -> list[dict]:
    """The episode through the anthropic SDK on base_url .../rollouts/{id}; returns the messages."""
    client = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"], max_retries=0)
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    for k, script in enumerate(scripts(gw)):
        kw = dict(model="m", max_tokens=256, system=INSTRUCTIONS, messages=messages, tools=ANTHROPIC_TOOLS,
                  extra_body={"script": script})
        if stream:
            with client.messages.stream(**kw) as s:
                text = "".join(s.text_stream)
                r = s.get_final_message()
            assert text == "".join(b.text for b in r.content if b.type == "text")
        else:
            r = client.messages.create(**kw)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True, exclude={"parsed_output"})
                                                          for b in r.content]})
        if k < 2:
            assert r.stop_reason == "tool_use"
            uses = [b for b in r.content if b.type == "tool_use"]
            assert [u.input for u in uses] == [{"city": CITIES[k]}]
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": RESULTS[k]}]})
        else:
            assert r.stop_reason == "end_turn" and r.content[-1].text == ANSWER
    return messages


def _check_chain(gw, ro) -> list:
    calls = gw.ledger.calls(ro["rollout_id"])
    assert len(calls) == 3 and calls[0].root
    for parent, call in zip(calls, calls[1:], strict=False):
        assert_continuation(gw.ledger, call, parent)
    return calls


def _tokens(rows: list[dict]) -> list[tuple]:
    return [(r["input_ids"], r["loss_mask"], r["logprobs"]) for r in rows]


DIALECTS = ["responses", "responses-stream", "anthropic", "anthropic-stream"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_dialect_tool_episode_gives_the_chat_episodes_rows(gw, dialect):
    chat_ro = gw.create_rollout(f"g-{dialect}")
    chat_messages = chat_episode(gw, chat_ro)
    chat_calls = _check_chain(gw, chat_ro)
    gw.finish(chat_ro["rollout_id"], messages=chat_messages, reward=1.0)

    ro = gw.create_rollout(f"g-{dialect}")
    fmt, _, stream = dialect.partition("-")
    if fmt == "responses":
        conversation = responses_episode(gw, ro, stream=bool(stream))
        conversation = [{"role": "system", "content": INSTRUCTIONS}, *conversation]
    else:
        conversation = anthropic_episode(gw, ro, stream=bool(stream))
        conversation = [{"role": "system", "content": INSTRUCTIONS}, *conversation]
    calls = _check_chain(gw, ro)
    # the engine was asked exactly what the Chat episode asked it
    assert [full_prompt(gw.ledger, c) for c in calls] == [full_prompt(gw.ledger, c) for c in chat_calls]
    assert [c.sampled_ids.tolist() for c in calls] == [c.sampled_ids.tolist() for c in chat_calls]
    gw.finish(ro["rollout_id"], messages=conversation, reward=1.0, format=fmt)
    rows, chat_rows = gw.rows(ro["rollout_id"]), gw.rows(chat_ro["rollout_id"])
    assert rows["invalid_reason"] is None and len(rows["rows"]) == 1
    assert _tokens(rows["rows"]) == _tokens(chat_rows["rows"])
    assert rows["rows"][0]["call_ids"] == [c.id for c in calls]


def test_one_rollout_mixes_dialects(gw):
    """A Chat call, then a Responses call, then a Messages call, each continuing the one before."""
    ro = gw.create_rollout("g-mixed")
    s = scripts(gw)
    oai = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    ant = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"], max_retries=0)
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    r1 = oai.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS, extra_body={"script": s[0]})
    m1 = r1.choices[0].message
    r2 = oai.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS, extra_body={"script": s[1]},
                              input=[{"role": "user", "content": QUESTION},
                                     *([{"type": "reasoning", "summary": [], "content": [
                                         {"type": "reasoning_text", "text": m1.reasoning_content}]}]
                                       if getattr(m1, "reasoning_content", None) else []),
                                     {"type": "function_call", "call_id": m1.tool_calls[0].id, "name": "get_weather",
                                      "arguments": m1.tool_calls[0].function.arguments},
                                     {"type": "function_call_output", "call_id": m1.tool_calls[0].id,
                                      "output": RESULTS[0]}])
    fc = r2.output[-1]
    first: list[dict] = [{"type": "tool_use", "id": m1.tool_calls[0].id, "name": "get_weather",
                          "input": json.loads(m1.tool_calls[0].function.arguments)}]
    if getattr(m1, "reasoning_content", None):
        first.insert(0, {"type": "thinking", "thinking": m1.reasoning_content, "signature": ""})
    r3 = ant.messages.create(model="m", max_tokens=64, system=INSTRUCTIONS, tools=ANTHROPIC_TOOLS,
                             extra_body={"script": s[2]}, messages=[
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": first},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m1.tool_calls[0].id,
                                      "content": RESULTS[0]}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": fc.call_id, "name": fc.name,
                                           "input": json.loads(fc.arguments)}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": fc.call_id, "content": RESULTS[1]}]},
    ])
    assert r3.content[0].text == ANSWER
    calls = _check_chain(gw, ro)
    assert [c.id for c in calls] == [r1.id, r2.id.removeprefix("resp_"), r3.id.removeprefix("msg_")]


def test_previous_response_id_continues_within_a_rollout_and_is_refused_across(gw):
    s = scripts(gw)
    ro = gw.create_rollout("g-prev")
    client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
    r1 = client.responses.create(model="m", instructions=INSTRUCTIONS, input=QUESTION, tools=RESPONSES_TOOLS,
                                 extra_body={"script": s[0]})
    fc = [o for o in r1.output if o.type == "function_call"][0]
    r2 = client.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS,
                                 previous_response_id=r1.id, extra_body={"script": s[2]}, stream=False,
                                 input=[{"type": "function_call_output", "call_id": fc.call_id, "output": RESULTS[0]}])
    assert r2.previous_response_id == r1.id and r2.output_text == ANSWER
    c1, c2 = gw.ledger.calls(ro["rollout_id"])
    assert_continuation(gw.ledger, c2, c1)
    # streamed, previous_response_id to the streamed answer
    events = list(client.responses.create(model="m", instructions=INSTRUCTIONS, tools=RESPONSES_TOOLS, stream=True,
                                          previous_response_id=r2.id, input="And tomorrow?"))
    c3 = gw.ledger.calls(ro["rollout_id"])[-1]
    assert events[-1].response.id == "resp_" + c3.id
    assert_continuation(gw.ledger, c3, c2)

    other = gw.create_rollout("g-prev")
    o_client = OpenAI(base_url=other["base_url"], api_key=other["api_key"], max_retries=0)
    before = dump_ledger(gw.ledger_path)
    for rid, why in ((r2.id, "another rollout"), ("resp_nope", "not a response of this rollout")):
        with pytest.raises(Exception) as e:
            o_client.responses.create(model="m", input="hi", previous_response_id=rid)
        assert e.value.status_code == 400
        err = e.value.body
        assert err["param"] == "previous_response_id" and err["code"] == "previous_response_not_found"
        assert why in err["message"]
    # store=false: the response is not kept, so it cannot be continued
    r4 = o_client.responses.create(model="m", input="hi", store=False)
    assert gw.ledger.calls(other["rollout_id"])[0].id == r4.id.removeprefix("resp_")
    mid = dump_ledger(gw.ledger_path)
    with pytest.raises(Exception) as e:
        o_client.responses.create(model="m", input="again", previous_response_id=r4.id)
    assert "store=false" in e.value.body["message"]
    assert dump_ledger(gw.ledger_path) == mid
    assert len(mid[1]) == len(before[1]) + 1


def test_finish_takes_each_dialect_and_refuses_bad_conversations(gw):
    """The finish body's `format` names the dialect of its conversation(s); a conversation that is
    not one in that dialect gets 400 naming the field, and the rollout stays open."""
    from rowgrove.gateway.testing import GatewayError

    ro = gw.create_rollout("g-finish")
    items = responses_episode(gw, ro, stream=False)
    for body, where in (({"format": "dialect-x"}, "format"),
                        ({"format": "responses", "messages": [{"type": "function_call"}]}, "messages"),
                        ({"format": "anthropic", "messages": [{"role": "user", "content": [{"type": "tool_result",
                                                                                               "tool_use_id": "x"}]}]},
                         "messages"),
                        ({"format": "responses", "conversations": [items, [{"type": "function_call_output",
                                                                             "call_id": "nope", "output": "x"}]]},
                         "conversations[1]")):
        r = gw._http.post(f"/v1/rollouts/{ro['rollout_id']}/finish", json={"reward": 1.0, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == where, r.json()
    assert gw.ledger.get_rollout(ro["rollout_id"]).status == "open"
    out = gw.finish(ro["rollout_id"], conversations=[items], reward=0.5, format="responses")
    assert out["status"] == "finished"
    assert gw.rows(ro["rollout_id"])["invalid_reason"] is None
    with pytest.raises(GatewayError):
        gw.finish(ro["rollout_id"], messages=items, reward=0.5, format="responses")
