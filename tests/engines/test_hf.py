"""The hf engine on the 2x64 tiny model: greedy and seeded sampling, stops, batching,
cancellation, weight updates and failures."""

from __future__ import annotations

import asyncio

import pytest
import torch

from rowgrove.engines import SamplingParams, make_engine
from rowgrove.engines.base import teacher_forced_logprobs
from rowgrove.errors import EngineError, InputError


@pytest.fixture(scope="module")
def engine():
    eng = make_engine("hf", "tiny", max_batch=16)
    yield eng
    asyncio.run(eng.aclose())


def P(eng, text: str) -> list[int]:
    s = eng.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return eng.tokenizer.encode(s, add_special_tokens=False)


def run(coro):
    return asyncio.run(coro)


def test_greedy_is_argmax_and_logprobs_are_raw_teacher_forced(engine):
    p = P(engine, "hello")
    g = run(engine.generate(p, SamplingParams(temperature=0, max_tokens=12, top_logprobs=2)))
    again = run(engine.generate(p, SamplingParams(temperature=0, max_tokens=12)))
    assert g.token_ids == again.token_ids and len(g.token_ids) <= 12
    # reference: full forward without cache, argmax at every step
    ids = list(p)
    with torch.no_grad():
        for _ in g.token_ids:
            ids.append(int(engine.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert g.token_ids == ids[len(p):]
    lp, _ = teacher_forced_logprobs(engine.model, p, g.token_ids)
    assert g.logprobs == pytest.approx(lp, abs=1e-4)
    assert [t[0][0] for t in g.top_logprobs] == g.token_ids  # greedy picks the top-1
    assert all(t[0][1] >= t[1][1] for t in g.top_logprobs)


def test_seeded_sampling_is_reproducible_and_independent_of_batch_companions(engine):
    p = P(engine, "tell me a story")
    sp = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, seed=7)
    alone = run(engine.generate(p, sp))

    async def crowded():
        others = [engine.generate(P(engine, "x" * (3 * i)), SamplingParams(temperature=0.5 + 0.2 * i, max_tokens=5 + 4 * i, seed=i))
                  for i in range(5)]
        res = await asyncio.gather(*others[:2], engine.generate(p, sp), *others[2:])
        return res[2]

    batched = run(crowded())
    assert batched.token_ids == alone.token_ids
    assert batched.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    other_seed = run(engine.generate(p, SamplingParams(temperature=1.0, top_p=0.9, max_tokens=24, seed=8)))
    assert other_seed.token_ids != alone.token_ids
    # the reported logprob is the raw (temperature 1) one, not the sampling distribution's
    lp, _ = teacher_forced_logprobs(engine.model, p, alone.token_ids)
    assert alone.logprobs == pytest.approx(lp, abs=1e-4)


def test_tiny_top_p_is_greedy(engine):
    p = P(engine, "abc")
    g = run(engine.generate(p, SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=8, seed=1)))
    greedy = run(engine.generate(p, SamplingParams(temperature=0, max_tokens=8)))
    assert g.token_ids == greedy.token_ids


def test_max_tokens_gives_length(engine):
    g = run(engine.generate(P(engine, "a"), SamplingParams(temperature=0, max_tokens=5)))
    assert (len(g.token_ids), len(g.logprobs), g.finish_reason) == (5, 5, "length")
    assert engine.eot_id not in g.token_ids


def test_stop_string_and_stop_token_ids(engine):
    p = P(engine, "stop test")
    base = run(engine.generate(p, SamplingParams(max_tokens=30, seed=11)))
    assert len(base.token_ids) >= 12, "the seeded sample should run long enough for this test"
    tok = engine.tokenizer
    stop = tok.decode(base.token_ids[9:11])[-2:]
    first = next(j for j in range(len(base.token_ids)) if stop in tok.decode(base.token_ids[: j + 1]))
    g = run(engine.generate(p, SamplingParams(max_tokens=30, seed=11, stop=(stop,))))
    assert g.finish_reason == "stop" and g.token_ids == base.token_ids[: first + 1]
    sid = base.token_ids[6]
    g = run(engine.generate(p, SamplingParams(max_tokens=30, seed=11, stop_token_ids=(sid,))))
    assert g.finish_reason == "stop" and g.token_ids == base.token_ids[: base.token_ids.index(sid) + 1]


def test_concurrent_requests_are_batched_and_join_running_batches(engine):
    async def main():
        engine.step_batch_sizes.clear()
        first = asyncio.create_task(engine.generate(P(engine, "a"), SamplingParams(temperature=0, max_tokens=60, stop_token_ids=())))
        while len(engine.step_batch_sizes) < 3:
            await asyncio.sleep(0.001)
        rest = [engine.generate(P(engine, "b" * i), SamplingParams(max_tokens=10, seed=i)) for i in range(1, 7)]
        out = await asyncio.gather(first, *rest)
        return out

    out = run(main())
    sizes = list(engine.step_batch_sizes)
    assert sizes[:3] == [1, 1, 1]
    assert max(sizes) >= 5, sizes  # six requests shared steps, joining the running one
    assert (len(out[0].token_ids), out[0].finish_reason) == (60, "length")


def test_cancellation_drops_the_request(engine):
    async def main():
        long = asyncio.create_task(engine.generate(P(engine, "a"), SamplingParams(temperature=0, max_tokens=5000)))
        engine.step_batch_sizes.clear()
        while len(engine.step_batch_sizes) < 5:
            await asyncio.sleep(0.001)
        assert not long.done(), "greedy run ended early; pick another prompt"
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        engine.step_batch_sizes.clear()
        g = await engine.generate(P(engine, "b"), SamplingParams(max_tokens=4, seed=1))
        return g

    run(main())
    assert set(engine.step_batch_sizes) == {1}  # the cancelled row no longer shares steps


def test_update_weights_between_batches():
    eng = make_engine("hf", "tiny")
    try:
        p = P(eng, "w")
        before = run(eng.generate(p, SamplingParams(temperature=0, max_tokens=6)))
        head = {k: v.clone() for k, v in eng.model.state_dict().items() if k == "model.norm.weight"}
        assert before.weight_versions == [0] * len(before.token_ids)
        eng.update_weights({"model.norm.weight": head["model.norm.weight"] * 5.0})
        assert eng.weights_version == 1
        after = run(eng.generate(p, SamplingParams(temperature=0, max_tokens=6)))
        assert after.weight_versions == [1] * len(after.token_ids)
        assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
        with pytest.raises(InputError, match="not in the model"):
            eng.update_weights({"nope.weight": torch.zeros(1)})
    finally:
        run(eng.aclose())


def test_failure_is_engine_error_and_engine_recovers(engine, monkeypatch):
    real = engine.model.forward

    def boom(*a, **k):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.model, "forward", boom)
    with pytest.raises(EngineError, match="device lost"):
        run(engine.generate(P(engine, "x"), SamplingParams(max_tokens=3)))
    monkeypatch.setattr(engine.model, "forward", real)
    assert len(run(engine.generate(P(engine, "x"), SamplingParams(max_tokens=3, seed=0))).token_ids) >= 1


def test_bad_inputs(engine):
    with pytest.raises(InputError, match="empty"):
        run(engine.generate([], SamplingParams()))
    with pytest.raises(InputError, match="temperature"):
        SamplingParams(temperature=-1)


def test_closed_engine_refuses():
    eng = make_engine("hf", "tiny")
    run(eng.aclose())
    with pytest.raises(EngineError, match="closed"):
        run(eng.generate(P(eng, "x"), SamplingParams()))
