"""`rowgrove train --engine vllm|sglang --engine-url URL` against the stand-in servers: the
rollouts are sampled by the server (real tokens, the tiny model), the trainer pushes its weights
to it after every step as a checkpoint, the weight versions on the rows move with the syncs, and
with one step off-policy a stale rollout is masked when max_staleness says so."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rowgrove.assemble import rollout_rows
from rowgrove.cli import main
from rowgrove.ledger import Ledger
from rowgrove.standins import start_standin
from rowgrove.train.checkpoint import load_checkpoint
from rowgrove.train.config import TrainConfig
from rowgrove.train.loop import prepare_model_dir

pytestmark = pytest.mark.slow

FLAGS = ["--no-progress", "--threads", "1",
         "--set", "env=counter", "--set", "warmup_sft_steps=0", "--set", "eval_prompts=0",
         "--set", "prompts_per_step=2", "--set", "rollouts_per_prompt=2", "--set", "rollouts_per_minibatch=4",
         "--set", "max_tokens=32", "--set", "agent.max_actions=3", "--set", "agent.max_resamples=3",
         "--set", "agent.on_exhausted=score", "--set", "concurrency=4", "--set", "checkpoint_every=0",
         "--set", "lr=1e-2"]


@pytest.fixture(scope="module")
def model_dir():
    """The tiny task model after a short supervised warm-up (so its first action is well-formed and
    every rollout has an accepted turn to train): what the server serves and the trainer starts from."""
    cfg = TrainConfig(model="tiny-task", env="counter", warmup_sft_steps=80, warmup_sft_lr=1e-2, warmup_sft_batch=8,
                      agent={"max_actions": 3, "max_resamples": 3, "on_exhausted": "score"})
    return str(prepare_model_dir(cfg, log=lambda *a: None))


def _trained_versions(run_dir) -> dict[str, set[int]]:
    """Per step tag ("s1", "s2"): the weight versions of every trained token of its rollouts."""
    out: dict[str, set[int]] = {}
    with Ledger(run_dir / "ledger.sqlite", readonly=True) as led:
        for ro in led.rollouts("finished"):
            step = ro.metadata.get("tag")
            for row in rollout_rows(led, ro.id).rows:
                assert row.weight_versions is not None
                v = np.asarray(row.weight_versions)[np.asarray(row.loss_mask) == 1]
                out.setdefault(step, set()).update(int(x) for x in v)
    return out


def _metrics(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_two_steps_on_a_server_sync_weights_and_move_versions(kind, model_dir, tmp_path):
    with start_standin(kind, model_dir) as server:
        base = {k: v.clone() for k, v in server.engine.model.state_dict().items()}
        # weight decay moves the weights even when a tiny untrained model's rewards do not vary
        rc = main(["train", "--model", model_dir, "--engine", kind, "--engine-url", server.url,
                   "--steps", "2", "--out", str(tmp_path / "run"), *FLAGS, "--set", "weight_decay=0.5"])
        assert rc == 0
        log = server.log()
        after = server.engine.model.state_dict()
    # one checkpoint load per step, each from the run's weights folder
    assert len(log["weight_loads"]) == 2, log["weight_loads"]
    assert all(str(tmp_path / "run" / "weights") in json.dumps(w) for w in log["weight_loads"])
    # the server samples with exactly the trainer's final weights
    final = load_checkpoint(tmp_path / "run").model
    assert final.keys() == after.keys()
    assert all(torch.equal(final[k].cpu(), after[k].cpu()) for k in final)
    assert any(not torch.equal(base[k], after[k]) for k in base), "the trainer's weights never moved"
    recs = _metrics(tmp_path / "run")
    assert [r["weights_version"] for r in recs] == [1, 2]
    assert all(r["tokens_trained"] > 0 for r in recs)
    # step 1 sampled under version 0, step 2 under the weights synced after step 1
    assert _trained_versions(tmp_path / "run") == {"s1": {0}, "s2": {1}}
    # only the two newest synced checkpoints are kept
    assert sorted(p.name for p in (tmp_path / "run" / "weights").iterdir()) == ["v000001", "v000002"]


def test_off_policy_rollouts_staler_than_max_staleness_are_masked(model_dir, tmp_path):
    with start_standin("vllm", model_dir) as server:
        rc = main(["train", "--model", model_dir, "--engine", "vllm", "--engine-url", server.url,
                   "--steps", "2", "--out", str(tmp_path / "run"), *FLAGS,
                   "--set", "off_policy_steps=1", "--set", "max_staleness=0"])
        assert rc == 0
    recs = _metrics(tmp_path / "run")
    # step 2's rollouts were started before step 1's update: their oldest tokens are version 0,
    # one behind the policy that trains on them, so max_staleness=0 masks them
    assert recs[0]["stale_rollouts"] == 0 and recs[0]["staleness_max"] == 0
    assert recs[1]["staleness_max"] >= 1 and recs[1]["stale_rollouts"] >= 1
    assert min(_trained_versions(tmp_path / "run")["s2"]) == 0


def test_train_refuses_a_remote_engine_without_url(tmp_path, capsys):
    rc = main(["train", "--model", "tiny", "--engine", "vllm", "--steps", "1", "--out", str(tmp_path / "run")])
    assert rc == 2
    assert "needs engine_url" in capsys.readouterr().err
