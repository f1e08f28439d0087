"""Against real `vllm serve` processes on real vocabularies: Qwen3 (151,669 ids) and Llama 3.1
(128,256 ids), each a tiny random model on the family's own tokenizer.json and template
(tests/families.py `family_model_dir(name, vocab="real")`, head_dim 32, untied, its end-of-turn
made likely by `ending_model` so that turns end), both servers started side by side for this
module only.

Per family, through a real gateway whose engine is the vllm engine in front of that server:

- a new rollout's root prompt over a history with a tool call, its result, non-ASCII text and a
  new user turn (the ids the ledger stores and the engine sent) equals the running server's own
  `/tokenize` of the same `messages` and `tools`;
- every sampled id's logprob in the ledger (a root call and the continuation that follows it,
  streamed) equals the HF model's teacher-forced logprob of that id over the exact ids vLLM was
  given, within 1e-4 (docs/engines.md: fp32 on both sides agrees within about 1e-6);
- `POST /v1/weights` with a changed checkpoint moves the server: its probe logprobs and the
  ledger's logprobs of the next call follow the NEW weights (and differ from the old ones), and
  a second sync puts the old weights back.

Skipped (through tests/realfiles.py) without the real tokenizers or templates, and like the rest
of the suite without vLLM's environment. `-s` prints per-family figures.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from families import family_model_dir, require_families, tool_call_id
from real_vllm import RecordingVLLMEngine, ending_model
from realfiles import require_tokenizers
from transformers import AutoModelForCausalLM

from rowgrove.engines.launch import VLLMServer, start_vllm
from rowgrove.engines.verify import largest_difference, policy_logprobs
from rowgrove.gateway.testing import launch_gateway
from rowgrove.ledger import Ledger
from rowgrove.model.tiny import servable_kwargs

NAMES = ("qwen3", "llama3.1")
# the documented agreement of an fp32 server with an fp32 trainer is ~1e-6; the suite's bound
TOLERANCE = 1e-4
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]


def tool_history() -> list[dict[str, Any]]:
    """A conversation with one tool call, its result, non-ASCII text (accents, CJK, a symbol) and
    a new user turn: the history a root prompt is rendered from."""
    call = {"id": tool_call_id(0), "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Zürich", "days": 2},
                                                                        ensure_ascii=False)}}
    result = json.dumps({"ciel": "ensoleillé", "temp": "21°C", "東京": "晴れ"}, ensure_ascii=False)
    return [{"role": "system", "content": "You are a helpful assistant. Réponds brièvement."},
            {"role": "user", "content": "Wie ist das Wetter in Zürich? 東京も教えて。"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": tool_call_id(0), "content": result},
            {"role": "assistant", "content": "In Zürich ist es sonnig, 21°C ☀."},
            {"role": "user", "content": "Et demain à Genève ? 明日は？"}]


def _hf(folder: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def real_models() -> dict[str, Path]:
    """Each family's servable tiny model on its real vocabulary (untied, turns end), built offline
    once into the cache (the first build of the two takes about a minute here)."""
    require_families(list(NAMES))
    require_tokenizers(list(NAMES))
    out = {n: ending_model(family_model_dir(n, vocab="real", **servable_kwargs(), tie_embeddings=False))
           for n in NAMES}
    for folder in out.values():  # a tied head would not follow a folder reload on CPU (test_weights.py)
        assert json.loads((folder / "config.json").read_text()).get("tie_word_embeddings") is False, folder
    return out


@pytest.fixture(scope="module")
def real_servers(vllm_py, real_models, tmp_path_factory) -> dict[str, VLLMServer]:
    """`vllm serve` of both folders, started in parallel (--gpu-memory-utilization 0.15: on CPU the
    share of RAM; the default 0.92 is refused while other processes hold memory), stopped at the
    end of the module."""
    logs = tmp_path_factory.mktemp("vllm-real-vocab-logs")
    started: dict[str, VLLMServer] = {}
    t0 = time.monotonic()

    def start(name: str) -> tuple[str, VLLMServer]:
        return name, start_vllm(real_models[name], python=vllm_py, log_path=logs / f"{name}.log", omp_threads=1,
                                extra_args=["--gpu-memory-utilization", "0.15"])

    try:
        with ThreadPoolExecutor(len(NAMES)) as pool:
            futures = [pool.submit(start, n) for n in NAMES]
            errors = []
            for f in futures:
                try:
                    name, server = f.result()
                    started[name] = server
                except Exception as e:  # noqa: BLE001 - both are waited for, then the first is raised
                    errors.append(e)
            if errors:
                raise errors[0]
        print(f"\n[real vocab] both servers up in {time.monotonic() - t0:.1f} s: "
              + ", ".join(f"{n} {s.startup_s:.1f} s" for n, s in started.items()))
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module", params=NAMES)
def served(request, real_models, real_servers, tmp_path_factory):
    """(name, folder, server, gateway handle, recording engine, HF model) for one family; the
    gateway's engine streams."""
    name = request.param
    folder, server = real_models[name], real_servers[name]
    engine = RecordingVLLMEngine(str(folder), server.url, stream=True)
    engine.check()  # the server serves this folder's tokenizer
    handle = launch_gateway(str(folder), engine=engine, ledger=tmp_path_factory.mktemp(f"gw-{name}") / "l.db")
    yield name, folder, server, handle, engine, _hf(folder)
    handle.close()
    asyncio.run(engine.aclose())


def _chat(ro: dict, messages: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    r = httpx.post(f"{ro['base_url']}/chat/completions", timeout=120,
                   headers={"authorization": f"Bearer {ro['api_key']}"},
                   json={"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 24,
                         "temperature": 1.0, "seed": seed})
    assert r.status_code == 200, r.text
    return r.json()


def _calls(handle, rollout_id: str) -> list:
    with Ledger(handle.ledger.path, readonly=True) as led:
        return sorted(led.calls(rollout_id), key=lambda c: c.ordinal)


@pytest.fixture(scope="module")
def episode(served) -> dict[str, Any]:
    """One rollout per family: the tool history (a root), then the model's answer echoed back with
    a new user turn (a continuation); the ledger's calls and the bodies vLLM got."""
    name, folder, server, handle, engine, _ = served
    n0 = len(engine.sent)
    ro = handle.create_rollout(f"real-{name}")
    messages = tool_history()
    r1 = _chat(ro, messages, seed=21)
    messages += [r1["choices"][0]["message"], {"role": "user", "content": "Merci ! Und übermorgen?"}]
    messages[-2] = {k: v for k, v in messages[-2].items() if v is not None}
    r2 = _chat(ro, messages, seed=22)
    final = {k: v for k, v in r2["choices"][0]["message"].items() if v is not None}
    calls = _calls(handle, ro["rollout_id"])
    return {"rollout": ro, "messages": tool_history(), "conversation": [*messages, final], "calls": calls,
            "sent": engine.sent[n0:]}


def test_a_root_prompt_with_tool_history_is_the_running_servers_own_tokenize(served, episode):
    name, folder, server, _, _, _ = served
    root = episode["calls"][0]
    assert root.root and root.status == "completed", (root.status, root.error)
    r = httpx.post(f"{server.url}/tokenize", timeout=60, json={
        "model": str(folder), "messages": episode["messages"], "tools": TOOLS, "add_generation_prompt": True})
    assert r.status_code == 200, r.text
    theirs, ours = r.json()["tokens"], root.prompt_ids.tolist()
    if ours != theirs:
        from rowgrove.model.load import load_tokenizer

        tok = load_tokenizer(str(folder))
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                     min(len(ours), len(theirs)))
        pytest.fail(f"{name}: the gateway's root prompt and vLLM's /tokenize differ from position {first}:\n"
                    f"rowgrove {tok.decode(ours[first:first + 30])!r}\nvLLM     {tok.decode(theirs[first:first + 30])!r}")
    assert episode["sent"][0]["prompt"] == ours  # and that is what the engine was given
    assert max(ours) >= 100_000  # ids only a real vocabulary has (the chat markers)
    print(f"\n[real vocab] {name}: root prompt {len(ours)} ids = vLLM /tokenize (tool call, result, non-ASCII, "
          f"new user turn)")


def test_the_ledgers_logprobs_are_the_hf_models_teacher_forced_logprobs(served, episode):
    name, _, _, handle, _, model = served
    calls, sent = episode["calls"], episode["sent"]
    assert [c.status for c in calls] == ["completed", "completed"], [(c.status, c.error) for c in calls]
    c1, c2 = calls
    assert c2.parent_id == c1.id and not c2.root  # the second call continues the first
    assert sent[1]["prompt"] == c1.prompt_ids.tolist() + c1.sampled_ids.tolist() + c2.prompt_ids.tolist()
    worst = 0.0
    for call, body in zip(calls, sent, strict=True):
        prompt, sampled = body["prompt"], call.sampled_ids.tolist()
        assert sampled and len(call.logprobs) == len(sampled)
        hf = policy_logprobs(model, prompt + sampled)[len(prompt) - 1:]
        diff, where = largest_difference(hf, call.logprobs.tolist())
        assert diff <= TOLERANCE, (f"{name} call {call.ordinal}: the ledger's logprob of sampled id "
                                   f"{sampled[where]} (position {where}) is {diff:.2e} from the HF model's")
        worst = max(worst, diff)
    # the row trains on exactly those ids with exactly those logprobs
    handle.finish(episode["rollout"]["rollout_id"], messages=episode["conversation"], reward=1.0)
    (row,) = handle.rows(episode["rollout"]["rollout_id"])["rows"]
    ids, mask, lps = row["input_ids"], row["loss_mask"], row["logprobs"]
    assert ids == sent[1]["prompt"] + c2.sampled_ids.tolist()
    trained = [i for i, m in enumerate(mask) if m]
    hf = policy_logprobs(model, ids)
    assert largest_difference([hf[i - 1] for i in trained], [lps[i] for i in trained])[0] <= TOLERANCE
    print(f"\n[real vocab] {name}: {len(c1.sampled_ids)} + {len(c2.sampled_ids)} sampled ids "
          f"(finish {c1.finish_reason}, {c2.finish_reason}), ledger vs HF teacher-forced max |d logprob| "
          f"{worst:.1e}; row of {len(ids)} ids, {len(trained)} trained")


def _served_logprobs(engine, ids: list[int]) -> list[float]:
    with httpx.Client(timeout=120) as http:
        got = engine._score(http, engine.urls[0], ids)
    assert got is not None
    return got


def test_a_weight_sync_through_the_gateway_moves_the_engines_logprobs(served, tmp_path):
    name, folder, _, handle, engine, old = served
    new = _hf(folder)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    ckpt = tmp_path / "ckpt"
    new.save_pretrained(str(ckpt))
    version0 = engine.weights_version
    probe = engine.sync_probe_ids()
    t0 = time.monotonic()
    try:
        r = httpx.post(f"{handle.url}/v1/weights", json={"path": str(ckpt)}, timeout=300)
        assert r.status_code == 200, r.text
        sync_s = time.monotonic() - t0
        assert engine.weights_version == version0 + 1
        served_now = _served_logprobs(engine, probe)
        d_new = largest_difference(policy_logprobs(new, probe), served_now)[0]
        d_old = largest_difference(policy_logprobs(old, probe), served_now)[0]
        assert d_new <= TOLERANCE and d_old > 1e-2, (d_new, d_old)
        # a call sampled after the sync: its ledger logprobs are the new model's
        ro = handle.create_rollout(f"after-sync-{name}")
        n0 = len(engine.sent)
        _chat(ro, tool_history(), seed=31)
        (call,) = _calls(handle, ro["rollout_id"])
        prompt, sampled = engine.sent[n0]["prompt"], call.sampled_ids.tolist()
        d_call = largest_difference(policy_logprobs(new, prompt + sampled)[len(prompt) - 1:], call.logprobs.tolist())[0]
        assert d_call <= TOLERANCE, d_call
        assert set(call.weight_versions.tolist()) == {version0 + 1}
    finally:
        r = httpx.post(f"{handle.url}/v1/weights", json={"path": str(folder)}, timeout=300)
        assert r.status_code == 200, r.text
    back = largest_difference(policy_logprobs(old, probe), _served_logprobs(engine, probe))[0]
    assert back <= TOLERANCE, back
    print(f"\n[real vocab] {name}: sync {sync_s:.1f} s; probe vs new weights {d_new:.1e} (vs old {d_old:.2f}); "
          f"next call vs new {d_call:.1e}; restored {back:.1e}")
