"""Weight versions over real HTTP: the gateway stores the version that sampled each token (the
engine's own list, or the version it read before asking), shows it in the lineage and the rows,
and refuses (502, call failed, nothing completed) an engine that reports a bad list."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import openai
import pytest
from openai import OpenAI

from fixtures_http import TestEngine, scripted_engine
from rowgrove.algo import staleness
from rowgrove.assemble import row_from_json
from rowgrove.engines.base import Generation, SamplingParams
from rowgrove.gateway.testing import start_gateway

USER = [{"role": "user", "content": "hi"}]


class VersionedEngine(TestEngine):
    """The shared scripted engine behind a settable `weights_version`; `versions` (a function of
    the sampled length) replaces the inner engine's `weight_versions` when set: None reports none."""

    __test__ = False

    def __init__(self, inner: Any):
        super().__init__(inner)
        self.weights_version = 0
        self.versions: Any = "inner"

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        gen = await super().generate(prompt_ids, sampling, hints=hints)
        if self.versions == "inner":
            return gen
        vs = None if self.versions is None else self.versions(len(gen.token_ids))
        return Generation(gen.token_ids, gen.logprobs, gen.finish_reason, gen.top_logprobs, weight_versions=vs)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    engine = VersionedEngine(scripted_engine("tiny"))
    with start_gateway("tiny", engine=engine, ledger=tmp_path_factory.mktemp("wv") / "ledger.db") as handle:
        handle.test_engine = engine
        yield handle


@pytest.fixture(autouse=True)
def _reset(gw):
    yield
    gw.test_engine.weights_version = 0
    gw.test_engine.versions = "inner"


def _client(ro) -> OpenAI:
    return OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)


def test_versions_are_stored_shown_in_the_lineage_and_carried_by_rows(gw):
    eng = gw.test_engine
    ro = gw.create_rollout("g-wv")
    client = _client(ro)
    # call 1: the engine reports none, so every token gets the version read before asking (4)
    eng.weights_version, eng.versions = 4, None
    r1 = client.chat.completions.create(model="m", messages=USER)
    # call 2 continues call 1: the engine's own list, which changes mid-call, is stored as given
    eng.weights_version, eng.versions = 5, (lambda n: [5] * (n - 1) + [6])
    messages = USER + [r1.choices[0].message.model_dump(), {"role": "user", "content": "more"}]
    r2 = client.chat.completions.create(model="m", messages=messages)
    c1, c2 = gw.ledger.calls(ro["rollout_id"])
    assert c2.parent_id == c1.id
    assert c1.weight_versions.tolist() == [4] * len(c1.sampled_ids)
    assert c2.weight_versions.tolist() == [5] * (len(c2.sampled_ids) - 1) + [6]

    lineage = gw.lineage(ro["rollout_id"])
    assert [c["weight_version"] for c in lineage["calls"]] == [[4, 4], [5, 6]]

    gw.finish(ro["rollout_id"], messages=messages + [r2.choices[0].message.model_dump()], reward=1.0)
    (row,) = [row_from_json(d) for d in gw.rows(ro["rollout_id"])["rows"]]
    n1, n2 = len(c1.prompt_ids), len(c2.prompt_ids)
    s1, s2 = len(c1.sampled_ids), len(c2.sampled_ids)
    assert row.weight_versions.tolist() == ([-1] * n1 + [4] * s1 + [-1] * n2 + [5] * (s2 - 1) + [6])
    assert staleness([row], 7) == {ro["rollout_id"]: 3}


def test_the_scripted_engine_reports_its_own_version(gw):
    ro = gw.create_rollout("g-wv-inner")
    gw.test_engine.weights_version = 9   # ignored: the inner engine reports its own (0) per token
    _client(ro).chat.completions.create(model="m", messages=USER)
    (c,) = gw.ledger.calls(ro["rollout_id"])
    assert c.weight_versions.tolist() == [0] * len(c.sampled_ids)


@pytest.mark.parametrize("bad", [lambda n: [0] * (n + 1), lambda n: [0] * (n - 1), lambda n: [-1] * n,
                                 lambda n: [1.5] * n], ids=["long", "short", "negative", "float"])
def test_a_bad_version_list_is_502_and_the_call_failed(gw, bad):
    ro = gw.create_rollout("g-wv-bad")
    gw.test_engine.versions = bad
    with pytest.raises(openai.InternalServerError) as info:
        _client(ro).chat.completions.create(model="m", messages=USER)
    assert info.value.status_code == 502
    assert info.value.response.json()["error"]["code"] == "engine_failed"
    (c,) = gw.ledger.calls(ro["rollout_id"])
    assert c.status == "failed" and "bad weight versions" in c.error
    assert c.response is None and c.weight_versions is None and len(c.sampled_ids) > 0
    assert gw.lineage(ro["rollout_id"])["calls"][0]["weight_version"] is None
    assert gw.gateway.in_flight == 0
    # the gateway still serves the next call
    gw.test_engine.versions = "inner"
    _client(ro).chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
    assert gw.ledger.calls(ro["rollout_id"])[-1].status == "completed"


def test_scripted_update_weights_moves_the_versions_of_later_calls(tmp_path):
    from rowgrove.engines import make_engine

    eng = make_engine("scripted", "tiny")   # its own engine: the shared one keeps version 0
    try:
        with start_gateway("tiny", engine=eng, ledger=tmp_path / "ledger.db") as handle:
            ro = handle.create_rollout("g-upd")
            client = _client(ro)
            r1 = client.chat.completions.create(model="m", messages=USER)
            eng.update_weights(dict(eng.model.state_dict()))
            messages = USER + [r1.choices[0].message.model_dump(), {"role": "user", "content": "and?"}]
            client.chat.completions.create(model="m", messages=messages)
            assert [c["weight_version"] for c in handle.lineage(ro["rollout_id"])["calls"]] == [[0, 0], [1, 1]]
    finally:
        asyncio.run(eng.aclose())


@pytest.mark.parametrize("before, expected", [
    (0, ([0, 0, 0], None)),
    (7, ([7, 7, 7], None)),
    (-1, ([], "versions must be ints in [0, 2**31), got [-1]")),
    (True, ([], "versions must be ints in [0, 2**31), got [True]")),
    (2**31, ([], "versions must be ints in [0, 2**31), got [2147483648]")),
])
def test_an_engine_without_versions_gives_each_token_the_version_it_held(before, expected):
    from rowgrove.gateway.sessions import call_weight_versions

    gen = Generation(token_ids=[5, 6, 7], logprobs=[0.0] * 3, finish_reason="stop")
    assert call_weight_versions(gen, before) == expected
    empty = Generation(token_ids=[], logprobs=[], finish_reason="length")
    assert call_weight_versions(empty, before) == ([], None)
