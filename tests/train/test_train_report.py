"""Config from YAML + overrides; metrics, plots and the self-contained report."""

from __future__ import annotations

import json

import pytest

from rowgrove.errors import InputError
from rowgrove.train.config import TrainConfig, load_config
from rowgrove.train.report import append_metrics, read_metrics, truncate_metrics, write_report


def test_config_from_yaml_then_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 7\nlr: 0.01\nloss_mode: rollout-mean\nagent:\n  compaction: keep_last_rounds\n")
    cfg = load_config(p, ["lr=2e-3", "packed=false", "agent.every_k=3", "out=runs/x"])
    assert cfg.steps == 7 and cfg.lr == 0.002 and cfg.packed is False and cfg.out == "runs/x"
    assert cfg.loss_mode == "rollout-mean"
    assert dict(cfg.agent) == {"compaction": "keep_last_rounds", "every_k": 3}
    assert TrainConfig().steps != 7  # the default is untouched


@pytest.mark.parametrize("bad, match", [
    (["stepz=3"], "unknown config field 'stepz'"),
    (["steps=three"], "steps is an integer"),
    (["loss_mode=seq-mean"], "loss_mode='seq-mean'"),
    (["lr"], "not key=value"),
    (["packed=1"], "true/false"),
])
def test_bad_config_is_named(bad, match):
    with pytest.raises(InputError, match=match):
        load_config(None, bad)


def test_metrics_plots_and_report(tmp_path):
    for s in range(1, 5):
        append_metrics(tmp_path, {"step": s, "reward_mean": 0.1 * s, "rows_per_rollout": 1.5, "entropy": 2.0})
    truncate_metrics(tmp_path, 3)
    append_metrics(tmp_path, {"step": 4, "reward_mean": 0.9, "rows_per_rollout": 2.0})
    recs = read_metrics(tmp_path)
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and recs[-1]["reward_mean"] == 0.9
    path = write_report(tmp_path, recs, {"reward first": 0.1, "reward last": 0.9},
                        config={"lr": 1}, lineages=[("r1", "<svg id='lin'></svg>")])
    page = path.read_text()
    assert page.count("data:image/png;base64,") == 3  # reward_mean, rows_per_rollout, entropy
    assert "<svg id='lin'></svg>" in page and "reward last" in page
    assert "src=\"http" not in page and "src='http" not in page  # self-contained
    assert (tmp_path / "plots" / "curves.png").stat().st_size > 1000
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
