"""TRL's AsyncGRPO (trl.experimental.async_grpo) trains rowgrove rows, and its weight transfer
reaches the engine the gateway samples from.

Rollouts come from a real gateway on loopback: a compaction agent (rowgrove.agents.compaction's
keep_last_rounds) on the tiny Qwen3-family model with Qwen3's real chat template, scripted
engine, official OpenAI SDK (trl_async_rollouts). Each rollout is 4 calls in 2 contexts: 2 rows.

AsyncGRPOTrainer itself needs a FlashAttention-3 kernel for its tree attention (GPU only), so its
data path (RolloutQueueDataset, FixedCountBatcher, DataCollatorForRollout) and its sequence
builder (_chain_to_sequences) run here on the rows, and its loss divisors are read off the
collated batch (trl_async_compare).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.trainers

try:
    import trl  # noqa: F401
except ImportError:
    from rg_integration_env import require_or_skip

    require_or_skip("TRL is not installed: pip install 'rowgrove[trl]'")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from families import family_model_dir, require_families  # noqa: E402

require_families(["qwen3"], module=True)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import trl_async_compare as C  # noqa: E402
import trl_async_rollouts as R  # noqa: E402
from trl.experimental.async_grpo import AsyncGRPOConfig  # noqa: E402
from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset, _iter_vllm_named_params  # noqa: E402

from rowgrove.engines.verify import policy_logprobs  # noqa: E402
from rowgrove.errors import InputError  # noqa: E402
from rowgrove.integrations.harness import rollouts_to_rows  # noqa: E402
from rowgrove.integrations.trl_async import (  # noqa: E402
    AsyncGRPOError,
    GatewayWeightTransfer,
    RowgroveRolloutWorker,
    rows_to_samples,
)
from rowgrove.integrations.weighting import weigh_rows  # noqa: E402


def config(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), token_budget=0, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, num_generations=R.NUM_GENERATIONS, report_to="none",
                bf16=False, use_cpu=True)
    return AsyncGRPOConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def folder():
    return family_model_dir("qwen3")


@pytest.fixture(scope="module")
def recorded(folder):
    from rowgrove.gateway.testing import start_gateway

    with start_gateway(str(folder), engine="scripted") as gw:
        yield R.record(gw)


@pytest.fixture(scope="module")
def model_tok(folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval(),
            AutoTokenizer.from_pretrained(str(folder)))


def test_samples_are_the_rows_with_rowgroves_weights(recorded, tmp_path):
    """Each row is one sample with the row's exact ids, loss mask and engine logprobs; through
    AsyncGRPO's own batcher and collator, every trained token's loss coefficient (advantage /
    global_n_tokens / accumulation steps) is rowgrove's advantage x loss weight."""
    rows = recorded.rows
    worker = RowgroveRolloutWorker(config(tmp_path), lambda prompts, w: rows, R.PROMPTS,
                                   prompts_per_step=len(R.PROMPTS))
    samples = worker.produce()
    assert len(rows) == 8 and len(samples) == 8  # 4 rollouts x 2 rows = one step of 4 x 2
    for row, s in zip(rows, samples, strict=True):
        assert s.input_ids.tolist() == list(row.input_ids)
        assert s.completion_mask.tolist() == [int(m != 0) for m in row.loss_mask]
        assert np.array_equal(s.old_log_probs, np.asarray(row.logprobs, np.float32))
    weighted = weigh_rows(rows)
    expected = np.concatenate([w.coef_T[np.asarray(w.row.loss_mask) != 0] for w in weighted.rows])
    got = []
    dicts = [C._sample_dict(s.input_ids, s.completion_mask, s.old_log_probs, s.advantage, s.group_id, None, 0.0)
             for s in samples]
    for mb in C.FixedCountBatcher(dicts, 1, 4):
        batch = C.DataCollatorForRollout(pad_token_id=0)([mb])
        sel = batch["token_index"][0] >= 0
        coef = batch["advantages"][0][sel].double() / float(batch["global_n_tokens"][0]) / 2
        got.append((batch["segment_id"][0][sel].numpy(), coef.numpy(), mb[0].samples))
    # the batcher groups samples by group id: compare per sample, in each sample's own order
    per_sample = {}
    for seg, coef, ss in got:
        for i, s in enumerate(ss):
            per_sample[id(s["input_ids"])] = coef[seg == i]
    flat = np.concatenate([per_sample[k] for k in per_sample])
    assert flat.size == expected.size == sum(int(np.count_nonzero(r.loss_mask)) for r in rows)
    assert np.allclose(np.sort(flat), np.sort(expected), rtol=1e-6, atol=1e-9)


def test_compacted_rollout_keeps_its_weight_share(recorded):
    """A rollout that became 2 rows weighs, in AsyncGRPO's loss, what rowgrove's token-mean and
    rollout-mean give it, whatever micro-batch its rows land in."""
    for mode in ("token-mean", "rollout-mean"):
        for mb in (1, 3, 4):
            rows = recorded.rows
            g = -(-len(rows) // mb)
            samples = rows_to_samples(rows, microbatch_size=mb, gradient_accumulation_steps=g, loss_mode=mode)
            weighted = weigh_rows(rows, loss_mode=mode)
            adv = {w.row.rollout_id: float(w.row.advantage) for w in weighted.rows}
            rids = [w.row.rollout_id for w in weighted.rows] + [None] * (len(samples) - len(rows))
            dicts = [C._sample_dict(s.input_ids, s.completion_mask, s.old_log_probs, s.advantage, s.group_id, r,
                                    adv.get(r, 0.0)) for s, r in zip(samples, rids, strict=True)]
            shares = C.collate_weights(dicts, mb)
            target: dict[str, float] = {}
            for w in weighted.rows:
                target[w.row.rollout_id] = target.get(w.row.rollout_id, 0.0) + float(w.weight_T.sum())
            assert {r for r in adv if adv[r] != 0} == set(shares)
            for r, share in shares.items():
                assert share == pytest.approx(target[r], rel=1e-6), (mode, mb, r)


def test_refuses_configs_that_break_the_loss(recorded, tmp_path):
    for bad in (dict(token_budget=4096), dict(weight_sync_steps=2), dict(max_staleness=0), dict(temperature=0.7)):
        with pytest.raises(InputError, match="AsyncGRPOConfig"):
            RowgroveRolloutWorker(config(tmp_path, **bad), lambda p, w: [], R.PROMPTS)
    with pytest.raises(InputError, match="max_lag"):
        RowgroveRolloutWorker(config(tmp_path), lambda p, w: [], R.PROMPTS, max_lag=0)


def test_a_long_batch_of_rollouts_is_not_a_hung_worker(recorded, tmp_path):
    """AsyncGRPO aborts training when check_health finds the worker silent longer than
    heartbeat_stale_after_s (300 s by default): a batch of agent rollouts may take longer than
    that, and is not a hang while the worker's thread runs it. A worker that produced nothing
    and runs nothing is."""
    import threading
    import time

    release, entered = threading.Event(), threading.Event()

    def rows_fn(prompts, worker):
        entered.set()
        assert release.wait(30)
        return recorded.rows

    worker = RowgroveRolloutWorker(config(tmp_path), rows_fn, R.PROMPTS[:1])
    time.sleep(0.3)
    with pytest.raises(AsyncGRPOError, match="produced nothing for"):
        worker.check_health(0.1)  # not started: silent, and nothing running
    worker.start()
    try:
        assert entered.wait(10)
        time.sleep(0.3)
        worker.check_health(0.1)  # 0.3 s into one batch: alive
        release.set()
        deadline = time.monotonic() + 30
        while worker.steps_produced < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.steps_produced >= 1 and not worker.rollout_buffer.empty()
        worker.check_health(5.0)  # the finished batch beat
    finally:
        release.set()
        worker.stop()


def test_worker_and_weight_transfer_against_a_live_gateway(folder, model_tok, tmp_path):
    """The protocol as AsyncGRPOTrainer drives it: init, a cold sync, start, then a sync per
    step. AsyncGRPO's RolloutQueueDataset drains the worker; after a sync of changed weights the
    rows' engine logprobs are the trained model's own on the same ids (the update reached the
    sampler), and each step's samples carry the version they were sampled with."""
    import copy

    import torch

    from rowgrove.engines import make_engine
    from rowgrove.gateway.testing import start_gateway

    model, _ = model_tok
    trained = copy.deepcopy(model)
    engine = make_engine("scripted", str(folder))
    with start_gateway(str(folder), engine=engine) as gw:
        traces: list = []

        def rows_fn(prompts, worker):
            return rollouts_to_rows(gw.url, prompts, R.make_agent(traces), concurrency=1)

        worker = RowgroveRolloutWorker(config(tmp_path), rows_fn, R.PROMPTS[:1], prompts_per_step=2)
        transfer = GatewayWeightTransfer(gw.url, tmp_path / "weights", trained.config,
                                         reference=lambda ids: policy_logprobs(trained, ids))
        transfer.init_weight_transfer()
        v0 = transfer.versions[-1]
        transfer.send_weights(_iter_vllm_named_params(trained))  # the cold sync at train begin
        worker.update_model_version(1)
        worker.start()
        try:
            metrics: dict = defaultdict(list)
            version = [1]  # the trainer's model_version, as AsyncGRPOTrainer counts its syncs
            ds = iter(RolloutQueueDataset(worker.rollout_buffer, lambda: version[0], worker.check_health, 60, metrics,
                                          poll_interval_s=1.0))
            first = [next(ds) for _ in range(8)]
            with torch.no_grad():  # an optimizer step's worth of change
                for p in trained.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            transfer.send_weights(_iter_vllm_named_params(trained))
            version[0] = 2
            worker.update_model_version(2)
            second = [next(ds) for _ in range(8)]  # step 1: sampled at version 1 (max_lag 1)
            third = [next(ds) for _ in range(8)]   # step 2: sampled once version 2 was published
        finally:
            worker.stop()
        assert transfer.versions == [v0, v0 + 1, v0 + 2]
        assert len(transfer.gaps) == 2 and max(transfer.gaps) <= 1e-3  # each sync verified by the probe
        assert int(gw.get("/v1/weights")["weights_version"]) == v0 + 2
        assert [s["advantage"] != 0 for s in first].count(True) >= 4
        assert worker.steps_produced >= 3
        rows = [r for r in worker.last_rows]
        assert rows and all(set(v for v in r.weight_versions if v >= 0) == {v0 + 2} for r in rows)
        ids = third[0]["input_ids"]
        mask = third[0]["completion_mask"][1:].astype(bool)
        with torch.no_grad():
            logp = torch.log_softmax(trained(input_ids=torch.as_tensor(ids)[None]).logits[0, :-1].float(), -1)
        lp = logp.gather(1, torch.as_tensor(ids[1:])[:, None])[:, 0].numpy()
        assert np.abs(lp - third[0]["old_log_probs"][1:])[mask].max() <= 1e-4
        with torch.no_grad():
            logp0 = torch.log_softmax(model(input_ids=torch.as_tensor(ids)[None]).logits[0, :-1].float(), -1)
        lp0 = logp0.gather(1, torch.as_tensor(ids[1:])[:, None])[:, 0].numpy()
        assert np.abs(lp0 - third[0]["old_log_probs"][1:])[mask].max() > 1e-3  # the weights did move
        assert [s["advantage"] != 0 for s in second].count(True) >= 4
        assert max(metrics["sample/staleness_max"]) == 1  # AsyncGRPO's own count: step 1 was one sync behind


def test_comparison_with_asyncgrpos_harness_path(recorded, model_tok):
    """The figures of docs/integrations.md's AsyncGRPO table (trl_async_compare.py prints it)."""
    model, tok = model_tok
    figures = C.compare(recorded, tok, model, R.TOOLS)
    ours = figures["rowgrove"]
    assert ours["sequences"] == 8 and ours["sequences_per_rollout"] == [2]
    assert ours["sampled_not_trained"] == ours["context_differs"] == ours["old_logprob_differs"] == 0
    assert ours["max_rollout_weight_deviation"] < 1e-6
    # the final call of each rollout follows a new user message: Qwen3's template drops the
    # earlier <think>, so AsyncGRPO's re-render is not what the engine was given, and it forks
    last_call = sum(len(cs[-1].sampled_ids) for cs in recorded.calls.values())
    for thr in (1024, 0):
        f = figures[f"AsyncGRPO fork_threshold_tokens={thr}"]
        assert f["sequences"] == 12 and f["sequences_per_rollout"] == [3]
        assert f["transitions"] == {"clean": 4.0, "realign": 0.0, "fork": 8.0}
        assert f["sampled_not_trained"] == 0
        assert f["context_differs"] == last_call
        assert 0 < f["old_logprob_differs"] <= last_call
        assert f["max_rollout_weight_deviation"] > 0.01
