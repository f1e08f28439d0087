"""The trainer end to end on the CPU: tiny model, SFT warm-up, the HF engine behind the real
gateway, the reference agent with compaction, rows from the ledger, a GRPO update; and resume
equivalence (4 steps in one go == 2 + resume + 2, bit for bit)."""

from __future__ import annotations

import json

import pytest
import torch

from rowgrove.errors import InputError
from rowgrove.train.checkpoint import load_checkpoint
from rowgrove.train.config import TrainConfig
from rowgrove.train.loop import train

SMALL = dict(
    model="tiny-task", env="counter", threads=1, progress=False,
    agent={"compaction": "keep_last_rounds", "every_k": 2, "max_resamples": 1, "max_actions": 4,
           "on_exhausted": "score"},  # score an episode whose resamples ran out: train on every rollout
    prompts_per_step=2, rollouts_per_prompt=2, rollouts_per_minibatch=2, max_tokens=32,
    # 80 warm-up steps: the first action is well-formed, so every rollout has an accepted turn to
    # train (a finish whose record holds no assistant message trains nothing, and a rejected
    # response is never trained)
    warmup_sft_steps=80, warmup_sft_lr=1e-2, warmup_sft_batch=8, eval_prompts=0,
    lr=1e-3, checkpoint_every=2, concurrency=1,  # one request at a time: bit-exact sampling
)


def _weights(run_dir):
    return load_checkpoint(run_dir).model


def test_one_training_step_end_to_end(tmp_path):
    cfg = TrainConfig(**{**SMALL, "steps": 1, "eval_prompts": 2, "concurrency": 4, "out": str(tmp_path / "run")})
    summary = train(cfg, log=lambda *a: None)
    run = tmp_path / "run"
    rec = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("step", "reward_mean", "reward_std", "rows_per_rollout", "roots_per_rollout", "rejected_calls",
                "tokens_generated", "tokens_trained", "clip_fraction", "approx_kl", "entropy", "step_time",
                "invalid_rollouts"):
        assert key in rec, key
    assert rec["step"] == 1 and rec["tokens_generated"] > 0
    assert rec["rows_per_rollout"] >= 1
    assert (run / "ledger.sqlite").exists() and (run / "report.html").exists()
    report = (run / "report.html").read_text()
    assert '<mark class="trained"' in report  # the drawn rollouts' rows as text, trained spans marked
    assert "eval_reward" in report and "reward, mean of the last 3 steps" in report
    assert summary.eval_before is not None and summary.eval_after is not None
    assert rec["updates"] == 2 and rec["tokens_trained"] > 0  # 4 rollouts, 2 per mini-batch
    # a second run into the same directory is refused, pointing at --resume
    with pytest.raises(InputError, match="--resume"):
        train(cfg, log=lambda *a: None)


def test_resume_gives_the_same_weights(tmp_path):
    whole = TrainConfig(**{**SMALL, "steps": 4, "out": str(tmp_path / "a")})
    train(whole, log=lambda *a: None)
    first = whole.replace(steps=2, out=str(tmp_path / "b"))
    train(first, log=lambda *a: None)
    assert load_checkpoint(tmp_path / "b").step == 2
    train(first.replace(steps=4), resume=True, log=lambda *a: None)
    a, b = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert load_checkpoint(tmp_path / "b").step == 4
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ra = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_mean"] for r in ra] == [r["reward_mean"] for r in rb]


def test_max_staleness_masks_and_reports_per_step(tmp_path):
    cfg = TrainConfig(**{**SMALL, "steps": 2, "max_staleness": 0, "out": str(tmp_path / "run")})
    train(cfg, log=lambda *a: None)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # on-policy: step s samples under version s - 1 (one update per step) and is measured against
    # it, so nothing is stale; a None here would mean the rows carried no versions
    assert [(r["stale_rollouts"], r["staleness_max"]) for r in recs] == [(0, 0), (0, 0)]
    assert all(r["tokens_trained"] > 0 for r in recs)


def test_mask_stale_step_helper_counts_the_masked_rollouts():
    from rowgrove.train.loop import _mask_stale
    from rowgrove.types import Row

    rows = [Row("a", "g", [1, 2], [0, 1], weight_versions=[-1, 3]),
            Row("a", "g", [1, 2, 3], [0, 0, 1], weight_versions=[-1, 3, 5]),
            Row("b", "g", [1, 2], [0, 1], weight_versions=[-1, 5]),
            Row("c", "g", [1, 2], [0, 1])]
    out, rec = _mask_stale(rows, 5, 1)
    assert rec == {"stale_rollouts": 1, "staleness_max": 2}
    assert [(r.rollout_id, r.valid, r.mask_reason) for r in out] == [
        ("a", False, "stale"), ("a", False, "stale"), ("b", True, None), ("c", True, None)]
    assert _mask_stale(rows[3:], 5, 1)[1] == {"stale_rollouts": 0, "staleness_max": None}
