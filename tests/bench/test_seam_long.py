"""`rowgrove bench seam --long`: its seed statistics on hand-made numbers (intervals derived in
the comments), its plan (every arm of a seed shares one config; only the seam differs), and two
of its arms run for real through the same subprocess path: the same step-1 rollouts, token for
token, and the same evaluation of the warmed model."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pytest
import seam_defects as sd
import seam_stats as stats
from bench_seam import LONG, LONG_SEEDS, _run_in_subprocess, base_config, evals_of, plan, summarize, summarize_evals
from seam_report import verdicts, write_page
from test_bench_seam import SMALL, Page


def test_mean_ci_is_students_t_over_seeds():
    # mean 2, sample sd 1, n 3: half-width t(0.975, 2) / sqrt(3) = 4.303 / 1.7320508 = 2.48434
    c = stats.mean_ci([1.0, 2.0, 3.0])
    assert c["mean"] == 2.0 and c["n"] == 3
    assert c["half"] == pytest.approx(4.303 / math.sqrt(3))
    assert (c["lo"], c["hi"]) == pytest.approx((2 - 2.48434, 2 + 2.48434), abs=1e-5)
    one = stats.mean_ci([0.5])
    assert one["mean"] == 0.5 and one["lo"] is None and one["half"] is None
    assert stats.mean_ci([])["mean"] is None
    assert stats.t975(1) == 12.706 and stats.t975(30) == 2.042
    assert abs(stats.t975(60) - 2.000) < 0.002 and abs(stats.t975(1000) - 1.962) < 0.002
    with pytest.raises(ValueError, match="degree"):
        stats.t975(0)


def test_paired_gap_takes_differences_seed_by_seed():
    # a shared seed effect (0.1, 0.3, 0.5) cancels: the differences are -0.05, -0.04, -0.06
    # (mean -0.05, sd 0.01, half 4.303 * 0.01 / sqrt 3 = 0.02484): lower, though the two arms'
    # own intervals overlap widely
    ref = {"0": 0.10, "1": 0.30, "2": 0.50}
    arm = {"0": 0.05, "1": 0.26, "2": 0.44}
    g = stats.paired_gap(arm, ref)
    assert g["mean"] == pytest.approx(-0.05) and g["half"] == pytest.approx(0.024843, abs=1e-5)
    assert g["verdict"] == "lower"
    a, r = stats.mean_ci(list(arm.values())), stats.mean_ci(list(ref.values()))
    assert a["hi"] > r["lo"]  # unpaired, the intervals overlap
    assert stats.paired_gap({"0": 1.0, "1": 0.0}, {"0": 0.5, "1": 0.5})["verdict"] == "no difference measured"
    assert stats.paired_gap({"0": 0.6, "1": 0.7, "2": 0.65}, {"0": 0.5, "1": 0.6, "2": 0.55})["verdict"] == "higher"
    assert stats.paired_gap({"0": 0.6}, {"0": 0.5})["verdict"] == "no interval (one seed)"
    assert stats.paired_gap({"0": 0.6, "9": 0.1}, {"0": 0.5})["n"] == 1  # only seeds both ran


def test_steps_to_threshold_is_the_first_evaluation_at_or_above_it():
    assert stats.steps_to(0.6, {0: 0.45, 2: 0.58, 4: 0.60, 6: 0.7}) == 4
    assert stats.steps_to(0.6, {4: 0.61, 0: 0.45, 2: 0.65}) == 2  # in step order, whatever the dict order
    assert stats.steps_to(0.6, {0: 0.45, 2: 0.5}) is None


def _evals():
    # rowgrove and two defects over 3 seeds, evaluated at steps 0, 2, 4
    ev = {"rowgrove": {"0": {0: 0.45, 2: 0.55, 4: 0.62}, "1": {0: 0.44, 2: 0.58, 4: 0.64},
                       "2": {0: 0.46, 2: 0.56, 4: 0.61}},
          "row_divisor": {"0": {0: 0.45, 2: 0.54, 4: 0.63}, "1": {0: 0.44, 2: 0.59, 4: 0.63},
                          "2": {0: 0.46, 2: 0.55, 4: 0.61}},
          "rejected_trained": {"0": {0: 0.45, 2: 0.50, 4: 0.52}, "1": {0: 0.44, 2: 0.51, 4: 0.55},
                               "2": {0: 0.46, 2: 0.49, 4: 0.50}}}
    return ev


def test_summarize_evals_reports_final_late_and_steps_to_threshold():
    out = summarize_evals(_evals(), threshold=0.6)
    rg, rd, rj = out["rowgrove"], out["row_divisor"], out["rejected_trained"]
    assert rg["final_step"] == 4 and rg["final"]["mean"] == pytest.approx((0.62 + 0.64 + 0.61) / 3)
    assert rg["final_gap"]["mean"] == 0.0 and rg["final_gap"]["verdict"] == "no difference measured"
    # rejected_trained: differences -0.10, -0.09, -0.11 -> mean -0.10, sd 0.01
    assert rj["final_gap"]["mean"] == pytest.approx(-0.10) and rj["final_gap"]["verdict"] == "lower"
    # row_divisor: +0.01, -0.01, 0 -> an interval around 0
    assert rd["final_gap"]["verdict"] == "no difference measured"
    assert rg["late_steps"] == [0, 2, 4]
    assert rg["steps_to_threshold"] == {"0": 4, "1": 4, "2": 4} and rg["reached_threshold"] == "3/3"
    assert rj["steps_to_threshold"] == {"0": None, "1": None, "2": None}
    assert rj["steps_to_threshold_mean"] is None and rj["reached_threshold"] == "0/3"
    assert rg["by_step"]["0"]["half"] == pytest.approx(4.303 * 0.01 / math.sqrt(3))


def test_the_long_page_has_eval_curves_with_bands_and_a_plain_verdict_per_defect(tmp_path):
    ev = _evals()
    curves = {name: {s: [0.4, 0.5] for s in per} for name, per in ev.items()}
    result = {"figures": {}, "curves": curves, "defects": sd.DEFECTS,
              "seeds": 3, "seconds": 3600.0, "command": "rowgrove bench seam --long", "config": {"steps": 4},
              "quick": False, "long": True, "summary": summarize({}, curves),
              "reward": summarize_evals(ev, threshold=0.6)}
    page = Page()
    page.feed(write_page(result, tmp_path / "seam.html").read_text())
    ids = [f["id"] for f in page.figures]
    assert ids[-2:] == ["eval-curves", "eval-gaps"]
    for fig in page.figures[-2:]:
        assert fig["png"].startswith(b"\x89PNG") and [e["seam"] for e in fig["legend"]] == list(curves)
    said = dict(verdicts(result))
    assert said["rejected_trained"].startswith("costs reward: at step 4 its eval reward is -0.100 [")
    assert said["row_divisor"].startswith("no cost in reward measured on this task: ")
    # +0.01, -0.01, 0: mean 0, sd 0.01, half 0.024843: a cost above 0.025 is ruled out
    assert said["row_divisor"].endswith("holds 0 and rules out a cost larger than 0.025.")
    text = " ".join(page.text.split())
    assert "What each defect cost in reward" in text and "steps to eval 0.60" in text
    assert "not reached (0/3)" in text and "4.0 (3/3)" in text


def test_long_plan_differs_only_in_the_switched_defect():
    cfg = base_config(False, True)
    assert cfg.steps == LONG["steps"] and cfg.eval_every == LONG["eval_every"] > 0 and cfg.eval_prompts > 0
    runs = plan(cfg, LONG_SEEDS)
    assert len(runs) == LONG_SEEDS * len(sd.SEAMS)
    for seed in range(LONG_SEEDS):
        mine = [(name, c) for name, s, c in runs if s == seed]
        assert [n for n, _ in mine] == list(sd.SEAMS)  # every arm once, rowgrove's among them
        configs = {json.dumps(c.to_dict(), sort_keys=True) for _, c in mine}
        assert len(configs) == 1 and mine[0][1].seed == seed  # one config per seed: only the seam differs
    assert len({r[2].seed for r in runs}) == LONG_SEEDS


def _step_rollouts(ledger: Path, tag: str) -> list[tuple]:
    """The sampled ids of every call of the rollouts tagged `tag`, per group, as a sorted list."""
    db = sqlite3.connect(ledger)
    out = []
    for rid, group in db.execute("select id, group_id from rollouts where json_extract(metadata, '$.tag') = ?", (tag,)):
        ids = [bytes(b) for (b,) in db.execute("select sampled_ids from calls where rollout_id = ? order by ordinal", (rid,))]
        out.append((group, b"|".join(ids)))
    db.close()
    return sorted(out)


@pytest.mark.slow
def test_two_long_arms_share_the_warmed_model_the_step_1_rollouts_and_the_first_evaluation(tmp_path):
    # the long config, shrunk to the trainer tests' small sizes, through the subprocess path the
    # long run uses: rowgrove's arm and one defect's, same seed
    cfg = base_config(False, True, **{**SMALL, "steps": 2, "eval_every": 1, "eval_prompts": 4})
    from rowgrove.train.loop import prepare_model_dir

    start = prepare_model_dir(cfg.replace(seed=0), log=lambda *a: None)
    cfg = cfg.replace(model=str(start), warmup_sft_steps=0)
    (name_a, _, cfg_a), (name_b, _, cfg_b) = [r for r in plan(cfg, 1, ("rowgrove", "rejected_trained"))]
    recs_a, figs_a = _run_in_subprocess(cfg_a, name_a, 0, tmp_path, True)
    recs_b, figs_b = _run_in_subprocess(cfg_b, name_b, 0, tmp_path, False)
    assert len(figs_a) == 2 and figs_b == []
    s1_a = _step_rollouts(tmp_path / "rowgrove-s0" / "ledger.sqlite", "s1")
    s1_b = _step_rollouts(tmp_path / "rejected_trained-s0" / "ledger.sqlite", "s1")
    assert len(s1_a) == cfg.prompts_per_step * cfg.rollouts_per_prompt and s1_a == s1_b
    assert recs_a[0]["reward_mean"] == recs_b[0]["reward_mean"]
    ev_a, ev_b = evals_of(recs_a), evals_of(recs_b)
    assert sorted(ev_a) == sorted(ev_b) == [0, 1, 2]
    assert ev_a[0] == ev_b[0]  # the warmed model, evaluated on the same prompts and seeds
    assert _step_rollouts(tmp_path / "rowgrove-s0" / "ledger.sqlite", "eval-before") == \
        _step_rollouts(tmp_path / "rejected_trained-s0" / "ledger.sqlite", "eval-before")
