"""Weight sync against a real `vllm serve` (vLLM's CPU build): verified, never assumed.

- untied embeddings: a state-dict sync, `POST /v1/weights {"path"}` through the gateway and
  `rowgrove train --engine vllm` leave vLLM's logprobs on a probe equal to the trainer's own
  (fp32: within 1e-4; measured: ~1e-6);
- tied embeddings (as Qwen3-0.6B and Llama 3.2 1B have them): a checkpoint folder without
  `lm_head.weight` reloads every layer but the output layer, which keeps the OLD weights exactly
  (vLLM's CPU build pre-packs the output layer when weights are processed, and its in-place
  reload re-processes only layers it loaded a tensor into). rowgrove's check refuses that sync,
  naming the server, the version, the difference and what to do; with a sync_dir rowgrove writes
  the head into the checkpoint and the sync is exact; a state-dict sync always is.

Every test leaves its server with the weights it started with.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rowgrove.engines import make_engine
from rowgrove.engines.base import SamplingParams
from rowgrove.engines.verify import WeightSyncError, policy_logprobs, tied_without_head
from rowgrove.errors import EngineError
from rowgrove.gateway.testing import launch_gateway


def _model(folder) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def _perturbed(model: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # a tied model's shared tensor is one parameter: stays tied
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def _served(engine, ids: list[int]) -> list[float]:
    """vLLM's prompt logprobs of `ids[1:]`, asked directly."""
    with httpx.Client(timeout=120) as http:
        got = engine._score(http, engine.urls[0], ids)
    assert got is not None
    return got


def _probe(engine) -> list[int]:
    return engine.sync_probe_ids()


def test_a_state_dict_sync_of_an_untied_model_is_exact_and_checked(servers, models, tmp_path):
    folder = models["untied"]
    engine = make_engine("vllm", str(folder), url=servers["untied"].url, sync_dir=tmp_path / "sync",
                         sync_tolerance=1e-4)
    new = _perturbed(_model(folder), 1)
    try:
        engine.update_weights(new.state_dict(), reference=lambda ids: policy_logprobs(new, ids))
        assert engine.weights_version == 1 and not engine.stale
        ids = _probe(engine)
        np.testing.assert_allclose(_served(engine, ids), policy_logprobs(new, ids), rtol=0, atol=1e-4)
        assert np.max(np.abs(np.array(_served(engine, ids)) - policy_logprobs(_model(folder), ids))) > 1e-2
    finally:
        engine.update_weights(str(folder))
    np.testing.assert_allclose(_served(engine, ids), policy_logprobs(_model(folder), ids), rtol=0, atol=1e-4)


def test_the_gateway_weights_route_syncs_a_real_server(servers, models, tmp_path):
    folder = models["untied"]
    engine = make_engine("vllm", str(folder), url=servers["untied"].url)
    new = _perturbed(_model(folder), 2)
    ckpt = tmp_path / "ckpt"
    new.save_pretrained(str(ckpt))
    with launch_gateway(str(folder), engine=engine, ledger=tmp_path / "l.db") as gw:
        try:
            r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(ckpt)}, timeout=300)
            assert r.status_code == 200, r.text
            ids = _probe(engine)
            np.testing.assert_allclose(_served(engine, ids), policy_logprobs(new, ids), rtol=0, atol=1e-4)
            assert httpx.get(f"{gw.url}/v1/weights", timeout=30).status_code == 200
        finally:
            r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(folder)}, timeout=300)
            assert r.status_code == 200, r.text


def test_a_tied_checkpoint_without_its_head_is_refused_then_synced_with_the_head_written(servers, models, tmp_path):
    """The stale output layer, shown and handled: without sync_dir rowgrove loads the folder as
    is and its check refuses the server (the head is exactly the old one); with sync_dir it
    writes lm_head.weight into a copy and the same sync is exact."""
    folder = models["tied"]
    url = servers["tied"].url
    new = _perturbed(_model(folder), 3)
    ckpt = tmp_path / "saved"
    new.save_pretrained(str(ckpt))  # tied: save_pretrained writes no lm_head.weight
    assert tied_without_head(ckpt)
    plain = make_engine("vllm", str(folder), url=url, sync_tolerance=1e-4)
    ids = _probe(plain)
    try:
        with pytest.raises(WeightSyncError) as e:
            plain.update_weights(str(ckpt))
        msg = str(e.value)
        assert url in msg and "weight version 1" in msg and "lm_head.weight" in msg and "sync_dir" in msg
        assert plain.weights_version == 0
        with pytest.raises(EngineError, match="serves no call until"):
            asyncio.run(plain.generate(ids, SamplingParams(max_tokens=2)))
        # the cause, pinned: vLLM now computes the new body with the OLD output layer
        stale = _model(folder)
        with torch.no_grad():
            old_head = stale.lm_head.weight.detach().clone()
            stale.load_state_dict(new.state_dict())
            stale.config.tie_word_embeddings = False
            stale.lm_head.weight = torch.nn.Parameter(old_head)
        np.testing.assert_allclose(_served(plain, ids), policy_logprobs(stale, ids), rtol=0, atol=1e-4)

        fixed = make_engine("vllm", str(folder), url=url, sync_dir=tmp_path / "sync", sync_tolerance=1e-4)
        fixed.update_weights(str(ckpt), reference=lambda x: policy_logprobs(new, x))
        assert fixed.weights_version == 1 and not fixed.stale
        np.testing.assert_allclose(_served(fixed, ids), policy_logprobs(new, ids), rtol=0, atol=1e-4)
        # a state dict of a tied model carries its head: exact too
        newer = _perturbed(_model(folder), 4)
        fixed.update_weights(newer.state_dict())
        np.testing.assert_allclose(_served(fixed, ids), policy_logprobs(newer, ids), rtol=0, atol=1e-4)
    finally:
        restore = make_engine("vllm", str(folder), url=url, sync_dir=tmp_path / "restore")
        restore.update_weights(_model(folder).state_dict())
    np.testing.assert_allclose(_served(restore, ids), policy_logprobs(_model(folder), ids), rtol=0, atol=1e-4)


def test_rowgrove_train_on_a_real_vllm_server_keeps_it_on_the_trainers_weights(servers, models, tmp_path):
    from rowgrove.cli import main
    from rowgrove.train.checkpoint import load_checkpoint

    folder = models["untied"]
    url = servers["untied"].url
    # a short supervised warm-up moves the weights before the first sync, whatever the rollouts do
    flags = ["--no-progress", "--threads", "1", "--set", "env=counter", "--set", "warmup_sft_steps=2",
             "--set", "eval_prompts=0", "--set", "prompts_per_step=2", "--set", "rollouts_per_prompt=2",
             "--set", "rollouts_per_minibatch=4", "--set", "max_tokens=8", "--set", "agent.max_actions=2",
             "--set", "agent.max_resamples=0", "--set", "agent.on_exhausted=score", "--set", "concurrency=4",
             "--set", "checkpoint_every=0", "--set", "lr=1e-2", "--set", "weight_decay=0.5",
             "--set", "sync_tolerance=1e-4"]
    engine = make_engine("vllm", str(folder), url=url)
    try:
        rc = main(["train", "--model", str(folder), "--engine", "vllm", "--engine-url", url, "--steps", "2",
                   "--out", str(tmp_path / "run"), *flags])
        assert rc == 0
        recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [r["weights_version"] for r in recs] == [2, 3]  # the warm-up's weights are version 1
        final = _model(folder)
        final.load_state_dict(load_checkpoint(tmp_path / "run").model)
        ids = _probe(engine)
        np.testing.assert_allclose(_served(engine, ids), policy_logprobs(final, ids), rtol=0, atol=1e-4)
        assert np.max(np.abs(np.array(_served(engine, ids)) - policy_logprobs(_model(folder), ids))) > 1e-3, \
            "the trainer's weights never moved"
    finally:
        engine.update_weights(str(folder))


def test_the_weights_route_answers_a_refused_sync_with_the_reason(servers, models, tmp_path):
    """Through `POST /v1/weights` (a gateway whose engine has no sync_dir), the stale-head sync is
    an error answer naming the server and what to do, not a 200; the next call through that
    gateway is refused too, until a sync passes."""
    folder = models["tied"]
    url = servers["tied"].url
    new = _perturbed(_model(folder), 5)
    ckpt = tmp_path / "saved"
    new.save_pretrained(str(ckpt))
    engine = make_engine("vllm", str(folder), url=url, sync_tolerance=1e-4)
    with launch_gateway(str(folder), engine=engine, ledger=tmp_path / "l.db") as gw:
        try:
            r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(ckpt)}, timeout=300)
            assert r.status_code == 502, r.text
            msg = r.json()["error"]["message"]
            assert url in msg and "lm_head.weight" in msg and "sync_dir" in msg
            ro = gw.create_rollout("g")
            c = httpx.post(f"{ro['base_url']}/chat/completions", timeout=60,
                           headers={"authorization": f"Bearer {ro['api_key']}"},
                           json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            assert c.status_code == 502 and "serves no call until" in c.json()["error"]["message"]
        finally:
            restore = make_engine("vllm", str(folder), url=url, sync_dir=tmp_path / "restore")
            restore.update_weights(_model(folder).state_dict())
