"""What the server engines share (`rowgrove.engines.remote`): URLs, the server a call goes to
(rollout affinity, least-loaded, ties in turn), error mapping, reply checks, checkpoints and weight
loads on every server, one HTTP client per event loop. Server behaviour runs against two vLLM
stand-ins (one sampling engine between them) over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import threading

import httpx
import orjson
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import OpenAI

from rowgrove.engines import make_engine
from rowgrove.engines import remote
from rowgrove.engines.base import ExtendedIds, Generation, SamplingParams
from rowgrove.engines.remote import (
    PROBE_TEXT,
    check_generation,
    model_vocab_size,
    parse_urls,
    prune_checkpoints,
    retry_after,
    server_message,
    write_checkpoint,
)
from rowgrove.engines.vllm import VLLMEngine
from rowgrove.errors import BadRequest, EngineError, InputError, Unavailable
from rowgrove.gateway.testing import start_gateway
from rowgrove.model.load import load_tokenizer, model_dir
from rowgrove.standins import launch_standin, start_standin
from standin_fixtures import USER, as_list, entry

TOK = load_tokenizer("tiny")
PROMPT = list(TOK.encode(TOK.apply_chat_template(USER, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False))


@pytest.fixture(scope="module")
def servers():
    with start_standin("vllm", "tiny") as a:
        b = launch_standin("vllm", "tiny", engine=a.engine)
        try:
            yield a, b
        finally:
            b.close()


@pytest.fixture(autouse=True)
def _reset(servers):
    for s in servers:
        s.fault(None)
        s.state.segment_delay = 0.0


def _offline(urls="http://127.0.0.1:1") -> VLLMEngine:
    """An engine that is never checked (no server needed)."""
    return VLLMEngine("tiny", urls)


# ---- URLs and server choice ---------------------------------------------------------------------


def test_parse_urls():
    assert parse_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]
    assert parse_urls(["http://a:1,http://b:2", "https://c", "http://a:1"]) == ["http://a:1", "http://b:2", "https://c"]
    with pytest.raises(InputError, match="not an http"):
        parse_urls("a:1")
    with pytest.raises(InputError, match="no engine URL"):
        parse_urls(" , ")


def test_a_rollout_sticks_to_its_server_and_new_ones_take_the_least_loaded():
    e = _offline("http://a:1,http://b:2,http://c:3")
    # idle servers: rollouts spread in turn, even one call at a time
    assert [e.server_for(r) for r in ("r1", "r2", "r3", "r4")] == [0, 1, 2, 0]
    assert [e.server_for(r) for r in ("r3", "r1", "r2", "r3")] == [2, 0, 1, 2]
    e.in_flight = [5, 0, 3]
    assert e.server_for("r5") == 1 and e.server_for("r1") == 0  # new: least loaded; old: sticky
    e.in_flight = [0, 4, 0]
    assert e.server_for(None) in (0, 2) and e.server_for("r6") in (0, 2)
    assert e.server_for("r5") == 1


def test_affinity_forgets_the_least_recently_used(monkeypatch):
    monkeypatch.setattr(remote, "_AFFINITY_SIZE", 2)
    e = _offline("http://a:1,http://b:2")
    assert (e.server_for("r1"), e.server_for("r2")) == (0, 1)
    e.server_for("r1")           # r1 used again: r2 is now the oldest
    e.server_for("r3")
    assert list(e._affinity) == ["r1", "r3"]


def test_calls_of_a_rollout_stay_on_one_server_and_rollouts_spread(servers, tmp_path):
    a, b = servers
    engine = make_engine("vllm", "tiny", url=[a.url, b.url])
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "l.db") as gw:
        placed = {}
        for name in ("A", "B", "C", "D"):
            ro = gw.create_rollout(f"g-{name}")
            client = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            for turn in range(3):
                client.chat.completions.create(model="tiny", messages=USER + [{"role": "user", "content": str(turn)}],
                                               max_tokens=3)
            calls = gw.ledger.calls(ro["rollout_id"])
            where = {("a" if entry(a, c.id) else "") + ("b" if entry(b, c.id) else "") for c in calls}
            assert len(calls) == 3 and len(where) == 1 and where <= {"a", "b"}, where  # one server, each call once
            placed[name] = where.pop()
            for c in calls:  # and the ledger holds what that server sampled
                assert as_list(c.sampled_ids) == entry(a if placed[name] == "a" else b, c.id)["token_ids"]
    assert placed == {"A": "a", "B": "b", "C": "a", "D": "b"}
    assert engine.in_flight == [0, 0]


# ---- replies and errors -------------------------------------------------------------------------


def _gen(**kw) -> Generation:
    base = {"token_ids": [5, 6], "logprobs": [-1.0, -0.5], "finish_reason": "stop", "weight_versions": None}
    return Generation(**{**base, **kw})


@pytest.mark.parametrize("gen,words", [
    (_gen(token_ids=[5, 1030]), "outside the vocabulary"),
    (_gen(token_ids=[5, -1]), "outside the vocabulary"),
    (_gen(token_ids=[5, True]), "outside the vocabulary"),
    (_gen(logprobs=[-1.0]), "2 token ids but 1 logprobs"),
    (_gen(logprobs=[-1.0, 0.5]), "not a number <= 0"),
    (_gen(logprobs=[-1.0, math.nan]), "not a number <= 0"),
    (_gen(weight_versions=[0]), "2 token ids but 1 weight versions"),
    (_gen(finish_reason="abort"), "finish reason 'abort'"),
    (_gen(finish_reason="error"), "finish reason 'error'"),
])
def test_check_generation_refuses_a_broken_reply(gen, words):
    with pytest.raises(EngineError, match=words):
        check_generation(gen, 1030, "the server")


def test_check_generation_accepts_a_good_reply():
    check_generation(_gen(weight_versions=[0, 1], logprobs=[-1.0, 0.0]), 1030, "the server")
    check_generation(_gen(token_ids=[], logprobs=[], finish_reason="length"), 1030, "the server")


def _response(status: int, body=None, headers=None, text=None) -> httpx.Response:
    req = httpx.Request("POST", "http://x/v1/completions")
    if body is not None:
        return httpx.Response(status, json=body, headers=headers, request=req)
    return httpx.Response(status, text=text or "", headers=headers, request=req)


@pytest.mark.parametrize("status,kind,words", [
    (429, Unavailable, "overloaded"), (503, Unavailable, "overloaded"),
    (500, EngineError, "answered 500"), (502, EngineError, "answered 502"),
    (401, EngineError, "API key"), (403, EngineError, "API key"),
    (404, EngineError, "is this a vllm server"), (400, BadRequest, "answered 400"), (422, BadRequest, "answered 422"),
])
def test_statuses_map_to_rowgrove_errors(status, kind, words):
    e = _offline()
    with pytest.raises(kind, match=words) as info:
        e.raise_for_status("http://x", _response(status, {"error": {"message": "boom"}}, {"retry-after": "7"}), "r1")
    assert type(info.value) is kind and "boom" in str(info.value) and "r1" in str(info.value)
    if kind is Unavailable:
        assert info.value.retry_after == 7.0
    e.raise_for_status("http://x", _response(200, {}), "r1")  # < 400: nothing


def test_server_message_and_retry_after():
    assert server_message(_response(400, {"error": {"message": "m1"}})) == "m1"
    assert server_message(_response(400, {"object": "error", "message": "m2"})) == "m2"  # older vLLM, flat
    assert server_message(_response(400, {"detail": "m3"})) == "m3"                     # FastAPI
    assert server_message(_response(500, {"error": "m4"})) == "m4"                      # vLLM dev routes
    assert server_message(_response(500, text="x" * 400)) == "x" * 300
    assert retry_after(_response(503, {}, {"retry-after": "3"})) == 3.0
    assert retry_after(_response(503, {}, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 1.0
    assert retry_after(_response(503, {})) == 1.0


def test_a_bad_prompt_is_refused_before_any_request(servers):
    a, _ = servers
    engine = make_engine("vllm", "tiny", url=a.url)
    before = len(a.state.requests)
    with pytest.raises(InputError, match="outside the vocabulary"):
        asyncio.run(engine.generate([1, 5000], SamplingParams(max_tokens=2)))
    with pytest.raises(InputError, match="empty"):
        asyncio.run(engine.generate([], SamplingParams(max_tokens=2)))
    assert len(a.state.requests) == before


def test_requests_without_a_call_id_get_distinct_ids(servers):
    a, _ = servers
    engine = make_engine("vllm", "tiny", url=a.url)

    async def main():
        return await asyncio.gather(*(engine.generate(PROMPT, SamplingParams(max_tokens=2)) for _ in range(4)))

    gens = asyncio.run(main())
    rids = [g["request_id"] for g in a.state.generations[-4:]]
    assert len(set(rids)) == 4 and all(r.startswith("rowgrove-") for r in rids)
    assert sorted(g.token_ids for g in gens) == sorted(g["token_ids"] for g in a.state.generations[-4:])


def test_one_engine_serves_many_event_loops(servers):
    a, _ = servers
    engine = make_engine("vllm", "tiny", url=a.url)
    sampling = SamplingParams(max_tokens=3, seed=1)
    first = asyncio.run(engine.generate(PROMPT, sampling))
    second = asyncio.run(engine.generate(PROMPT, sampling))  # a new loop: a new client, not the dead one
    out: list = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(engine.generate(PROMPT, sampling))))
    t.start()
    t.join(30)
    assert first.token_ids == second.token_ids == out[0].token_ids
    assert sum(not loop.is_closed() for loop in engine._clients) == 0  # every loop is gone now
    asyncio.run(engine.aclose())
    with pytest.raises(EngineError, match="closed"):
        asyncio.run(engine.generate(PROMPT, sampling))


# ---- the start-up check -------------------------------------------------------------------------


def test_compare_ids_names_the_first_difference():
    e = _offline()
    ours = e.probe_ids()
    assert ours == TOK.encode(PROBE_TEXT, add_special_tokens=False) and e.compare_ids(ours) == []
    (problem,) = e.compare_ids(ours[:3] + [7] + ours[4:])
    assert "first difference at position 3" in problem and f"server [7, {ours[4]}" in problem
    (problem,) = e.compare_ids(ours[:-1])
    assert f"local {len(ours)} ids, server {len(ours) - 1}" in problem and "(end)" in problem
    (problem,) = e.compare_ids(None)
    assert "answered None" in problem
    assert e.compare_chat_ids(e.probe_chat_ids()) == []
    (problem,) = e.compare_chat_ids(e.probe_chat_ids()[1:])
    assert "chat template" in problem and "another model folder" in problem


def test_model_vocab_size_takes_the_config_when_larger(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 1536}))
    assert model_vocab_size(tmp_path, TOK) == 1536
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 2048}}))
    assert model_vocab_size(tmp_path, TOK) == 2048
    (tmp_path / "config.json").write_text("{broken")
    assert model_vocab_size(tmp_path, TOK) == len(TOK)


# ---- weights ------------------------------------------------------------------------------------


def test_write_checkpoint_and_prune(tmp_path):
    emb = torch.randn(4, 3)
    sd = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "note": "not a tensor"}  # tied
    folder = write_checkpoint(sd, tmp_path / "v000001", model_dir("tiny"))
    from safetensors.torch import load_file

    back = load_file(str(folder / "model.safetensors"))
    assert set(back) == {"model.embed_tokens.weight", "lm_head.weight"} and torch.equal(back["lm_head.weight"], emb)
    assert (folder / "config.json").read_text() == (model_dir("tiny") / "config.json").read_text()
    for v in (2, 3):
        write_checkpoint(sd, tmp_path / f"v{v:06d}", model_dir("tiny"))
    (tmp_path / "v000009.tmp").mkdir()
    (tmp_path / "other").mkdir()
    prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "v000002", "v000003", "v000009.tmp"]


def test_update_weights_needs_sync_dir_for_a_state_dict(servers):
    engine = make_engine("vllm", "tiny", url=servers[0].url)
    with pytest.raises(InputError, match="needs sync_dir"):
        engine.update_weights({"model.norm.weight": torch.ones(64)})
    assert engine.weights_version == 0


def test_update_weights_loads_on_every_server(servers, tmp_path):
    a, b = servers
    engine = make_engine("vllm", "tiny", url=[a.url, b.url], sync_dir=tmp_path)
    sd = {k: v.detach().clone() for k, v in a.engine.model.state_dict().items()}
    loads = len(a.state.weight_loads), len(b.state.weight_loads)
    engine.update_weights({"model.norm.weight": sd["model.norm.weight"]})  # a subset is a checkpoint too
    assert engine.weights_version == 1
    for s, n in zip((a, b), loads, strict=True):
        (load,) = s.state.weight_loads[n:]
        assert load["path"] == str(tmp_path / "v000001") and load["tensors"] == 1
        assert not s.state.paused and [e["route"] for e in s.state.events[-5:]][0] == "/pause"
    assert (tmp_path / "v000001" / "model.safetensors").is_file()


def test_a_failed_load_keeps_the_version_and_resumes(servers, tmp_path):
    a, _ = servers
    engine = make_engine("vllm", "tiny", url=a.url)
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match=r"POST /collective_rpc answered 500: .*no \*\.safetensors"):
        engine.update_weights(tmp_path / "empty")
    assert engine.weights_version == 0
    assert not a.state.paused and a.state.events[-1]["route"] == "/resume"  # never left paused
    with pytest.raises(EngineError, match="cannot|failed"):
        make_engine("vllm", "tiny", url="http://127.0.0.1:1", check=False).update_weights(tmp_path / "empty")


def test_renice_descendants_sets_every_thread_of_every_descendant_and_not_the_parent(tmp_path):
    """rowgrove.engines.launch.renice_descendants: what start_vllm applies to a CPU server's engine
    processes (children and grandchildren; the parent keeps its priority)."""
    import os
    import subprocess
    import sys
    import time

    from rowgrove.engines.launch import descendants, renice_descendants

    if not os.path.isdir("/proc"):
        pytest.skip("no /proc")
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                               "print(c.pid, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while child not in descendants(parent.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert descendants(parent.pid) == [child]
        assert renice_descendants(parent.pid, 7) == (child,)
        assert all(os.getpriority(os.PRIO_PROCESS, int(t)) == 7 for t in os.listdir(f"/proc/{child}/task"))
        assert os.getpriority(os.PRIO_PROCESS, parent.pid) == os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        for p in descendants(parent.pid):
            os.kill(p, 9)
        parent.kill()
        parent.wait()


def test_a_model_vllms_cpu_attention_cannot_run_is_refused_before_start_up(tmp_path):
    """vLLM's CPU attention takes head_dim 32..512; the default tiny model (hidden 64, 4 heads:
    head_dim 16) would start and kill the engine on its first request, so the launcher refuses it
    by name, before looking for vLLM at all, and says how to build one it can serve."""
    import json

    from rowgrove.engines.launch import check_cpu_servable, start_vllm
    from rowgrove.model.tiny import servable_kwargs

    with pytest.raises(EngineError, match=r"head_dim 16 .*servable_kwargs"):
        start_vllm(model_dir("tiny"), python=tmp_path / "no-such-python")
    servable = tmp_path / "servable"
    servable.mkdir()
    kw = servable_kwargs()
    (servable / "config.json").write_text(json.dumps({"hidden_size": kw["hidden"], "num_attention_heads": kw["heads"]}))
    check_cpu_servable(servable)  # head_dim 32: fine
    (servable / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 2048, "num_attention_heads": 2}}))
    with pytest.raises(EngineError, match="head_dim 1024"):
        check_cpu_servable(servable)
    check_cpu_servable(tmp_path / "not-a-folder")  # a hub name: left to vLLM


# ---- the prompt check along a rollout -----------------------------------------------------------

_STEP = st.tuples(st.sampled_from(["extends", "extends", "equal copy", "changed", "plain", "bad id"]),
                  st.lists(st.integers(0, 100), min_size=1, max_size=6))


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_STEP, min_size=1, max_size=8))
def test_a_rollouts_prompts_are_checked_and_written_as_a_fresh_check_would(steps):
    """Each prompt of a rollout, as the gateway builds it (extending the very list the engine
    checked last) or any other way (an equal copy of it, a changed one, a plain list, an id outside
    the vocabulary), is accepted exactly when `check_prompt` accepts it, as the same ids, and its
    JSON is `orjson.dumps` of them, whichever way the engine got there."""
    from rowgrove.engines.base import check_prompt

    engine = _offline()
    last: list[int] | None = None
    for kind, new in steps:
        if kind == "bad id":
            new = [*new, engine.vocab_size]
        if last is None or kind == "plain":
            prompt = list(last or []) + new
        elif kind == "equal copy":
            prompt = ExtendedIds(list(last), new)
        elif kind == "changed":
            prompt = ExtendedIds([(last[0] + 1) % 50, *last[1:]], new)
        else:
            prompt = ExtendedIds(last, new)
        try:
            want = check_prompt(prompt, engine.vocab_size)
        except InputError:
            with pytest.raises(InputError):
                engine.checked_prompt(prompt, "r")
            continue
        got = engine.checked_prompt(prompt, "r")
        assert got == want and all(type(i) is int for i in got)
        assert engine.prompt_json(got) == orjson.dumps(want)
        last = prompt  # what the rollout's index holds, and the next prompt extends


def test_the_prompt_built_on_the_list_checked_last_is_kept_not_copied():
    engine = _offline()
    first = engine.checked_prompt([1, 2, 3], "r")
    second = ExtendedIds(first, [4, 5])
    assert engine.checked_prompt(second, "r") is second
    third = ExtendedIds(second, [6])
    assert engine.checked_prompt(third, "r") is third
    assert engine.prompt_json(third) == b"[1,2,3,4,5,6]"


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.lists(st.integers(0, 9), max_size=4), min_size=1, max_size=6),
       k=st.integers(-30, 30), a=st.integers(-30, 30), b=st.integers(-30, 30), step=st.sampled_from([None, 1, 2, -1]))
def test_extended_ids_read_as_the_list_they_make(parts, k, a, b, step):
    """A prompt held as parts (`ExtendedIds`, each extending the last) reads as the joined list:
    length, iteration, an index (IndexError out of range), any slice, ==, + on either side."""
    ids = ExtendedIds(list(parts[0]), *parts[1:2])
    for p in parts[2:]:
        ids = ExtendedIds(ids, p)
    flat = [i for p in parts for i in p]
    assert len(ids) == len(flat) and list(ids) == flat and ids == flat and ids.tolist() == flat
    assert ids[a:b:step] == flat[a:b:step]
    if -len(flat) <= k < len(flat):
        assert ids[k] == flat[k]
    else:
        with pytest.raises(IndexError):
            ids[k]
    assert ids + [7] == flat + [7] and [7] + ids == [7] + flat
    assert orjson.dumps(list(ids)) == orjson.dumps(flat)


_IDS = st.lists(st.one_of(st.integers(-3, 1033), st.booleans(), st.integers(0, 1029).map(lambda i: __import__("numpy").int64(i)),
                          st.floats(allow_nan=True)), max_size=8)
_LPS = st.lists(st.one_of(st.floats(max_value=0.0), st.floats(allow_nan=True, allow_infinity=True),
                          st.just(-1e308), st.integers(-5, 0), st.booleans()), max_size=8)


@settings(max_examples=400, deadline=None)
@given(ids=_IDS, lps=_LPS)
def test_check_generation_reads_plain_lists_as_it_reads_any(ids, lps):
    """The C-speed reading of plain int and float lists refuses exactly what the item-by-item
    rules refuse (an id outside [0, 1030) or not an integer, a bool; a logprob that is NaN,
    infinite, above 1e-3, not a number), whatever the mix and however the sum overflows."""
    from rowgrove.engines.base import _is_id, _is_logprob

    lps = lps[:len(ids)] + [-0.5] * max(0, len(ids) - len(lps))
    expected = all(_is_id(t, 1030) for t in ids) and all(_is_logprob(x) for x in lps)
    gen = Generation(token_ids=ids, logprobs=lps, finish_reason="stop")
    try:
        check_generation(gen, 1030, "the server")
        ok = True
    except EngineError:
        ok = False
    assert ok == expected


@settings(max_examples=300, deadline=None)
@given(ids=_IDS)
def test_check_prompt_reads_plain_lists_as_it_reads_any(ids):
    from rowgrove.engines.base import check_prompt

    try:
        expected = [int(i) for i in ids]
        expected = expected if expected and all(0 <= i < 1030 for i in expected) else None
    except (ValueError, OverflowError):
        expected = "raises"
    try:
        got = check_prompt(ids, 1030)
        assert got is not ids and all(type(i) is int for i in got)
    except InputError:
        got = None
    except (ValueError, OverflowError):
        got = "raises"
    assert got == expected


_TOKEN = st.one_of(st.integers(0, 10**6).map(lambda i: f"token_id:{i}"), st.integers(-5, 5).map(lambda i: f"token_id:{i}"),
                   st.sampled_from(["token_id:05", "token_id: 7", "token_id:+3", "token_id:1_0", "token_id:1e3",
                                    "token_id:1.5", "token_id:1,token_id:2", "token_id:3token_id:4", "token_id:[1]",
                                    "token_id:", "token_id:true", "5", "x,token_id:6", "token_id:8]", "tok"]),
                   st.text(max_size=12), st.integers(0, 9))


@settings(max_examples=500, deadline=None)
@given(tokens=st.lists(_TOKEN, max_size=6))
def test_logprob_tokens_read_at_c_speed_as_item_by_item(tokens):
    """`logprobs.tokens` read through one joined JSON parse names the ids the item-by-item reading
    names, and refuses what it refuses."""
    from rowgrove.engines.vllm import _token_ids

    def by_item(ts):
        if all(isinstance(t, str) and t.startswith("token_id:") for t in ts):
            return [int(t[9:]) for t in ts]
        raise ValueError

    try:
        expected = by_item(tokens)
    except ValueError:
        expected = None
    try:
        got = _token_ids(tokens)
        assert all(type(i) is int for i in got)
    except EngineError:
        got = None
    assert got == expected
