"""`rowgrove train --ray --gateways 2`: the reference trainer's rollouts on two gateway actors
(each an HF engine copy of the policy, synced after every step), one GRPO step end to end."""

from __future__ import annotations

import json

import pytest
import yaml

from rowgrove.cli import main
from rowgrove.train.checkpoint import load_checkpoint

pytest.importorskip("ray", reason="the `ray` extra is not installed")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SMALL = dict(
    model="tiny-task", env="counter", threads=1, progress=False,
    agent={"compaction": "keep_last_rounds", "every_k": 2, "max_resamples": 1, "max_actions": 4,
           "on_exhausted": "score"},
    prompts_per_step=2, rollouts_per_prompt=2, rollouts_per_minibatch=2, max_tokens=32,
    warmup_sft_steps=80, warmup_sft_lr=1e-2, warmup_sft_batch=8, eval_prompts=0,  # first actions well-formed
    lr=1e-3, checkpoint_every=1, concurrency=4, steps=1,
)


def test_train_ray_runs_a_step_over_two_gateways(local_ray, tmp_path, capsys):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(run), "--ray", "--gateways", "2"]) == 0
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["tokens_generated"] > 0 and rec["tokens_trained"] > 0 and rec["invalid_rollouts"] == 0
    assert rec["weights_version"] >= 1  # the step's weights reached the gateways' engines
    ledgers = sorted((run / "ledgers").glob("gateway-*.sqlite"))
    assert [p.name for p in ledgers] == ["gateway-0.0.sqlite", "gateway-1.0.sqlite"]
    saved = json.loads((run / "config.json").read_text())
    assert saved["ray"] is True and saved["gateways"] == 2
    assert load_checkpoint(run).step == 1
    # the run's rows, merged from both gateways' ledgers
    out = tmp_path / "rows.parquet"
    assert main(["rows", "--ledger", str(ledgers[0]), "--ledger", str(ledgers[1]), "--out", str(out)]) == 0
    assert "4 rollouts" in capsys.readouterr().out
