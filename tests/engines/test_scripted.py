"""The scripted engine: predictable replies, real teacher-forced logprobs."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rowgrove.engines import SamplingParams, make_engine
from rowgrove.errors import InputError
from rowgrove.model.load import end_of_turn_id
from rowgrove.toolcalls import format_tool_call, parse_assistant_text


@pytest.fixture(scope="module")
def engine():
    eng = make_engine("scripted", "tiny")
    yield eng
    asyncio.run(eng.aclose())


def prompt(eng, text="What is 2+2?"):
    s = eng.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return eng.tokenizer.encode(s, add_special_tokens=False)


def direct_logprobs(model, prompt_ids, ids):
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + ids])).logits[0]
    logp = torch.log_softmax(logits.float(), -1)
    return [float(logp[len(prompt_ids) - 1 + i, t]) for i, t in enumerate(ids)], logp


def test_reply_k_with_eot_and_teacher_forced_logprobs(engine):
    p = prompt(engine)
    g = asyncio.run(engine.generate(p, SamplingParams(top_logprobs=3), hints={"ordinal": 3}))
    eot = end_of_turn_id(engine.tokenizer)
    assert g.token_ids == engine.tokenizer.encode("reply 3", add_special_tokens=False) + [eot]
    assert engine.tokenizer.decode(g.token_ids[:-1]) == "reply 3"
    assert g.finish_reason == "stop"
    want, logp = direct_logprobs(engine.model, p, g.token_ids)
    assert g.logprobs == pytest.approx(want, abs=1e-5)
    assert all(lp < 0 for lp in g.logprobs)
    assert len(g.top_logprobs) == len(g.token_ids)
    best = int(logp[len(p) - 1].argmax())
    assert g.top_logprobs[0][0][0] == best and len(g.top_logprobs[0]) == 3


def test_script_hint_and_tool_call(engine):
    text = "Sure.\n" + format_tool_call("get_weather", {"city": "Oslo"})
    g = asyncio.run(engine.generate(prompt(engine), SamplingParams(), hints={"script": text, "ordinal": 1}))
    assert engine.tokenizer.decode(g.token_ids[:-1]) == text
    parsed = parse_assistant_text(engine.tokenizer.decode(g.token_ids[:-1]))
    assert parsed.tool_calls[0]["function"]["name"] == "get_weather"
    assert g.top_logprobs is None


def test_max_tokens_cuts_without_eot(engine):
    full = asyncio.run(engine.generate(prompt(engine), SamplingParams(), hints={"ordinal": 12}))
    g = asyncio.run(engine.generate(prompt(engine), SamplingParams(max_tokens=2), hints={"ordinal": 12}))
    assert g.finish_reason == "length" and g.token_ids == full.token_ids[:2]
    assert g.logprobs == pytest.approx(full.logprobs[:2], abs=1e-5)
    exact = asyncio.run(engine.generate(prompt(engine), SamplingParams(max_tokens=len(full.token_ids)), hints={"ordinal": 12}))
    assert exact.finish_reason == "stop" and exact.token_ids == full.token_ids


def test_stop_string_keeps_completing_token(engine):
    g = asyncio.run(engine.generate(prompt(engine), SamplingParams(stop=("ly",)), hints={"script": "reply now please"}))
    text = engine.tokenizer.decode(g.token_ids)
    assert g.finish_reason == "stop" and "ly" in text and "now" not in text


def test_needs_ordinal_or_script_and_a_prompt(engine):
    with pytest.raises(InputError, match="ordinal"):
        asyncio.run(engine.generate(prompt(engine), SamplingParams()))
    with pytest.raises(InputError, match="empty"):
        asyncio.run(engine.generate([], SamplingParams(), hints={"ordinal": 1}))
    with pytest.raises(InputError, match="outside the vocabulary"):
        asyncio.run(engine.generate([10**6], SamplingParams(), hints={"ordinal": 1}))


def test_concurrent_requests_do_not_block_the_loop(engine):
    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.create_task(ticker())
        gens = await asyncio.gather(*(engine.generate(prompt(engine), SamplingParams(), hints={"ordinal": k})
                                      for k in range(1, 9)))
        t.cancel()
        return gens, ticks

    gens, ticks = asyncio.run(main())
    assert [engine.tokenizer.decode(g.token_ids[:-1]) for g in gens] == [f"reply {k}" for k in range(1, 9)]
    assert ticks > 8


def test_update_weights_bumps_the_version_on_every_token():
    eng = make_engine("scripted", "tiny")
    try:
        p = prompt(eng)
        before = asyncio.run(eng.generate(p, SamplingParams(), hints={"ordinal": 2}))
        assert eng.weights_version == 0 and before.weight_versions == [0] * len(before.token_ids)
        norm = eng.model.state_dict()["model.norm.weight"].clone()
        eng.update_weights({"model.norm.weight": norm * 5.0})
        assert eng.weights_version == 1
        after = asyncio.run(eng.generate(p, SamplingParams(), hints={"ordinal": 2}))
        assert after.token_ids == before.token_ids                      # the script does not change
        assert after.weight_versions == [1] * len(after.token_ids)
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)  # the weights did
        assert after.logprobs == pytest.approx(direct_logprobs(eng.model, p, after.token_ids)[0], abs=1e-5)
        with pytest.raises(InputError, match="not in the model"):
            eng.update_weights({"nope.weight": torch.zeros(1)})
        assert eng.weights_version == 1
    finally:
        asyncio.run(eng.aclose())
