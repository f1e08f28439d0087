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
    (["lr_decay_to=2"], "lr_decay_to=2.0"),
    (["kl_coef=-1"], "kl_coef=-1.0"),
    (["max_staleness=two"], "max_staleness is an integer or null"),
    (["max_staleness=true"], "max_staleness is an integer or null"),
    (["max_staleness=1.5"], "max_staleness is an integer or null"),
    (["max_staleness=-1"], "max_staleness=-1"),
    (["eval_every=2", "eval_prompts=0"], "eval_every=2 with eval_prompts=0"),
    (["eval_every=-1"], "eval_every=-1"),
])
def test_bad_config_is_named(bad, match):
    with pytest.raises(InputError, match=match):
        load_config(None, bad)


def test_max_staleness_is_an_int_or_none(tmp_path):
    assert TrainConfig().max_staleness is None
    assert load_config(None, ["max_staleness=2"]).max_staleness == 2
    assert load_config(None, ["max_staleness=0"]).max_staleness == 0
    assert load_config(None, {"max_staleness": 3}).max_staleness == 3
    assert load_config(None, ["max_staleness=null"], base=TrainConfig(max_staleness=4)).max_staleness is None
    p = tmp_path / "c.yaml"
    p.write_text("max_staleness: 1\n")
    cfg = load_config(p)
    assert cfg.max_staleness == 1
    (tmp_path / "config.json").write_text(json.dumps(cfg.replace(max_staleness=None).to_dict()))
    assert load_config(tmp_path / "config.json").max_staleness is None   # as --resume reads it back


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


def test_lr_schedule_warms_up_then_decays_to_its_end_factor_at_the_last_update():
    from rowgrove.train.loop import lr_factor

    # 4 steps x ceil(64 / 16) = 16 updates; 2 warm-up updates, then linear to 0.1 at update 15
    f = lr_factor(TrainConfig(steps=4, rollouts_per_minibatch=16, lr_warmup_steps=2, lr_decay_to=0.1))
    assert [f(0), f(1), f(2)] == [0.5, 1.0, 1.0]
    assert f(15) == pytest.approx(0.1) and f(40) == pytest.approx(0.1)
    assert f(2) > f(8) > f(15)
    assert lr_factor(TrainConfig())(1000) == 1.0  # constant by default


def test_choose_examples_spreads_across_rewards_and_row_counts():
    from rowgrove.train.report import choose_examples

    # rewards / rows: 0:(1.0, 3) 1:(1.0, 1) 2:(0.0, 4) 3:(0.0, 1) 4:(0.5, 2) 5:(0.5, 6)
    rewards, rows = [1.0, 1.0, 0.0, 0.0, 0.5, 0.5], [3, 1, 4, 1, 2, 6]
    # highest reward: most rows 0, fewest 1; lowest: most 2, fewest 3 -> k=4 stops there
    assert choose_examples(rewards, rows, 4) == [0, 1, 2, 3]
    # then the most rows overall (5), then the median reward (sorted by reward: 2 3 4 5 0 1 -> 4)
    assert choose_examples(rewards, rows, 6) == [0, 1, 2, 3, 5, 4]
    # the old choice (most rows first) would have shown only 5, 2, 0: no single-row rollout
    assert choose_examples([], [], 3) == [] and choose_examples([0.2], [2], 3) == [0]


def test_report_plots_eval_before_after_labels_every_axis_and_has_a_complete_legend(tmp_path):
    from rowgrove.assemble.picture import COLOR
    from rowgrove.train.report import PLOTS, YLABELS

    assert {k for k, _ in PLOTS} <= set(YLABELS)  # every plot gets a y label (x is "step")
    assert {"ref_kl", "lr", "compactions"} <= {k for k, _ in PLOTS}
    recs = [{"step": s, "reward_mean": 0.1 * s, "ref_kl": 0.01 * s, "lr": 1e-3 / s, "compactions": 1.5} for s in (1, 2)]
    page = write_report(tmp_path, recs, {"reward, last step": 0.2}, evals=(0.45, 0.63)).read_text()
    assert (tmp_path / "plots" / "eval_reward.png").exists()
    assert page.count("data:image/png;base64,") == 5  # eval, reward_mean, ref_kl, lr, compactions
    for kind, color in COLOR.items():  # every mark of the lineage pictures, in its own colour
        assert f"background:{color}" in page, kind
    assert "rejected call" in page and "pending call" in page and "dashed line" in page
    assert write_report(tmp_path, recs, {}).read_text().count("data:image/png;base64,") == 4  # no eval: no plot


def test_eval_points_hold_the_steps_evaluated_between_in_order():
    from rowgrove.train.report import eval_points

    recs = [{"step": 1}, {"step": 2, "eval_reward": 0.5}, {"step": 3}, {"step": 4, "eval_reward": 0.55}, {"step": 5}]
    assert eval_points(0.4, 0.6, 5, recs) == [(0, 0.4), (2, 0.5), (4, 0.55), (5, 0.6)]
    assert eval_points(None, None, 5, recs) == [(2, 0.5), (4, 0.55)]
    assert eval_points(None, None, 5, [{"step": 1}]) == []
    assert eval_points(0.4, 0.6, 2) == [(0, 0.4), (2, 0.6)]

