"""`rowgrove train --nproc 2` (gloo, 2 CPU processes) trains what `--nproc 1` trains, and a
2-rank checkpoint resumes with 1 rank: the checkpoint holds the plain model whatever the ranks."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from rowgrove.cli import main
from rowgrove.train.checkpoint import load_checkpoint

from test_train_loop import SMALL

SLOW = pytest.mark.slow  # three short runs, one of them two spawned ranks (about a minute)


def _config(tmp_path):
    path = tmp_path / "small.yaml"
    # seed 3: step 2's groups have unequal rewards, so its update moves the weights (with seeds
    # 0-2 this weakly warmed model scores 0 everywhere in both steps and nothing would move)
    path.write_text(yaml.safe_dump({**SMALL, "steps": 2, "checkpoint_every": 1, "seed": 3}))
    return str(path)


def _close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def _rewards(run):
    return [json.loads(x)["reward_mean"] for x in (run / "metrics.jsonl").read_text().splitlines()]


@SLOW
def test_two_ranks_train_like_one_and_resume_with_one(tmp_path, capsys):
    cfg = _config(tmp_path)
    one, two, resumed = tmp_path / "one", tmp_path / "two", tmp_path / "resumed"
    assert main(["train", "--config", cfg, "--out", str(one)]) == 0
    assert main(["train", "--config", cfg, "--out", str(two), "--nproc", "2"]) == 0
    assert "report:" in capsys.readouterr().out  # rank 0 printed the summary
    a, b = load_checkpoint(one), load_checkpoint(two)
    assert a.step == b.step == 2
    _close(a.model, b.model)
    assert _rewards(one) == _rewards(two)
    started = torch.load(next((one / "checkpoints").glob("step-000001")) / "state.pt", weights_only=False)["model"]
    moved = max(float((started[k] - a.model[k]).abs().max()) for k in a.model)
    assert moved > 1e-5  # step 2 moved the weights (lr 1e-3): the equality above is not vacuous

    # the 2-rank run's step-1 checkpoint, resumed by one rank for the second step
    shutil.copytree(two, resumed)
    (resumed / "checkpoints" / "latest").write_text("step-000001\n")
    assert main(["train", "--resume", str(resumed), "--nproc", "1"]) == 0
    c = load_checkpoint(resumed)
    assert c.step == 2
    _close(a.model, c.model)
    assert _rewards(resumed) == _rewards(one)


@pytest.mark.parametrize("flags, says", [(["--nproc", "0"], "--nproc must be at least 1"),
                                         (["--gateways", "2"], "add --ray"),
                                         (["--ray-address", "auto"], "add --ray"),
                                         (["--ray", "--gateways", "0"], "gateways=0 (must be >= 1)")])
def test_bad_scale_flags_are_one_line_errors(tmp_path, capsys, flags, says):
    assert main(["train", "--config", _config(tmp_path), "--out", str(tmp_path / "x"), *flags]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
