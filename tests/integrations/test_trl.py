"""TRL's GRPOTrainer, subclassed, trains on rowgrove rows with rowgrove's loss.

Rows come from a real gateway episode (scripted engine on the tiny model, official OpenAI SDK):
each rollout makes two calls in one context, compacts it, and makes a third call in a new
context, so each rollout is two rows.
"""

from __future__ import annotations

import copy
import itertools
import os

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.trainers

try:
    import trl  # noqa: F401
except ImportError:
    from rg_integration_env import require_or_skip

    require_or_skip("TRL is not installed: pip install 'rowgrove[trl]'")

from rowgrove.algo import assign_advantages  # noqa: E402
from rowgrove.errors import InputError  # noqa: E402
from rowgrove.integrations.harness import Episode, rollouts_to_rows  # noqa: E402
from rowgrove.integrations.trl import RowgroveGRPOTrainer  # noqa: E402
from rowgrove.types import Row  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PROMPTS = ["Count the apples.", "Name a city."]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from rowgrove.gateway.testing import start_gateway

    with start_gateway("tiny", engine="scripted", ledger=tmp_path_factory.mktemp("trl") / "ledger.db") as handle:
        yield handle


@pytest.fixture(scope="module")
def tiny():
    from rowgrove.model.load import load_model

    model, tok = load_model("tiny")
    return model, tok


def make_agent(compact: bool):
    """An agent of 2 or 3 calls; every third rollout says a longer "no" and gets reward 0, the
    others "yes" and 1 (rollouts of different lengths: token-mean and rollout-mean differ)."""
    counter = itertools.count()

    async def agent(client, prompt):
        word = "no, not at all" if next(counter) % 3 == 0 else "yes"

        async def ask(messages, script):
            r = await client.chat.completions.create(model="policy", messages=messages, extra_body={"script": script})
            return {"role": "assistant", "content": r.choices[0].message.content}

        msgs = [{"role": "user", "content": prompt}]
        a1 = await ask(msgs, f"first {word}")
        msgs += [a1, {"role": "user", "content": "go on"}]
        a2 = await ask(msgs, f"second {word}")
        msgs.append(a2)
        if not compact:
            return Episode(reward=float(word == "yes"), messages=msgs)
        fresh = [{"role": "user", "content": f"{prompt} (two steps so far)"}]  # compaction: a new context
        a3 = await ask(fresh, f"done {word}")
        return Episode(reward=float(word == "yes"), messages=[*msgs, *fresh, a3])

    return agent


def grpo_args(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), loss_type="dapo", beta=0.0, learning_rate=0.5, optim="sgd",
                lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
                per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=2, max_steps=1,
                report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
                disable_tqdm=True, max_completion_length=64, seed=0)
    base.update(kw)
    return GRPOConfig(**base)


def dataset(prompts):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": list(prompts)})


def params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])


def split_in_two(row: Row) -> list[Row]:
    """The row as two rows of its rollout: tokens up to the middle of its generated tokens, and the
    whole row with the mask zeroed before that cut (full prefix kept as prompt)."""
    gen = np.flatnonzero(np.asarray(row.loss_mask))
    cut = int(gen[len(gen) // 2])
    lm, lp = np.asarray(row.loss_mask), np.asarray(row.logprobs)
    head = Row(row.rollout_id, row.group_id, np.asarray(row.input_ids)[:cut], lm[:cut], reward=row.reward,
               logprobs=lp[:cut])
    tail = Row(row.rollout_id, row.group_id, np.asarray(row.input_ids), np.where(np.arange(len(lm)) < cut, 0, lm),
               reward=row.reward, logprobs=np.where(np.arange(len(lp)) < cut, 0.0, lp), segment=1)
    return [head, tail]


def trl_step(model, tok, rows, tmp_path, **kw):
    trainer = RowgroveGRPOTrainer(model, args=grpo_args(tmp_path, **kw), rows_fn=lambda prompts, tr: rows,
                                  train_dataset=dataset(PROMPTS), processing_class=tok)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def compacted_rows(gw):
    rows = rollouts_to_rows(gw.url, [p for p in PROMPTS for _ in range(3)], make_agent(compact=True))
    return rows


def test_gateway_rollouts_with_compaction_are_two_rows_each(compacted_rows):
    by = {}
    for r in compacted_rows:
        by.setdefault(r.rollout_id, []).append(r)
    assert len(by) == 6 and all(len(v) == 2 for v in by.values())
    assert len({r.group_id for r in compacted_rows}) == 2
    assert {r.reward for r in compacted_rows} == {0.0, 1.0}
    assert all(r.logprobs is not None and np.asarray(r.logprobs)[np.asarray(r.loss_mask) == 1].max() < 0
               for r in compacted_rows)


def test_train_runs_two_steps_on_rows_from_a_gateway(gw, tiny, tmp_path):
    model, tok = tiny
    model = copy.deepcopy(model)
    before = params(model)
    seen = []

    def rows_fn(prompts, trainer):
        assert len(prompts) == 4  # per_device 2 x accumulation 2, each prompt twice
        rows = rollouts_to_rows(gw.url, prompts, make_agent(compact=True))
        seen.append(len(rows))
        return rows

    trainer = RowgroveGRPOTrainer(model, args=grpo_args(tmp_path, max_steps=2), rows_fn=rows_fn,
                                  train_dataset=dataset(PROMPTS * 2), processing_class=tok)
    out = trainer.train()
    assert out.global_step == 2
    assert seen == [8, 8]  # 4 rollouts x 2 rows, each step
    assert not torch.equal(params(model), before)
    logged = [h for h in trainer.state.log_history if "rowgrove/rows" in h]
    assert [h["rowgrove/rows"] for h in logged] == [8.0, 8.0]
    assert [h["rowgrove/rollouts"] for h in logged] == [4.0, 4.0]


@pytest.mark.parametrize("loss_mode", ["token-mean", "rollout-mean"])
def test_one_sgd_step_equals_rowgroves_update_and_does_not_depend_on_the_split(gw, tiny, tmp_path, loss_mode,
                                                                              compacted_rows):
    """fp32, plain SGD, no clipping of the gradient norm: one step of RowgroveGRPOTrainer on
    (a) the gateway rows, (b) the same rows each split in two, equals one `update_policy` step of
    rowgrove's own trainer on (a). Compared on the parameter update (new - old), within 1e-5
    relative: stricter than comparing parameters."""
    from rowgrove.train.update import update_policy

    model0, tok = tiny
    rows = compacted_rows
    split = [x for r in rows for x in split_in_two(r)]
    assert len(split) == 2 * len(rows)
    start = params(model0)

    deltas = {}
    for name, rs in (("rows", rows), ("split", split)):
        m = copy.deepcopy(model0)
        trainer = RowgroveGRPOTrainer(m, args=grpo_args(tmp_path / name), rows_fn=lambda p, t, rs=rs: rs,
                                      train_dataset=dataset(PROMPTS), processing_class=tok, loss_mode=loss_mode)
        trainer.train()
        deltas[name] = params(m) - start

    m = copy.deepcopy(model0)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    update_policy(m, opt, assign_advantages(rows), loss_mode=loss_mode, rollouts_per_minibatch=1000,
                  microbatch_tokens=256, clip_eps=0.2, max_grad_norm=0.0)
    deltas["rowgrove"] = params(m) - start

    ref = deltas["rowgrove"]
    assert ref.norm() > 0
    for name in ("rows", "split"):
        rel = float((deltas[name] - ref).norm() / ref.norm())
        assert rel < 1e-5, f"{name}: TRL's update differs from rowgrove's by {rel:.2e} (relative)"


def test_rows_not_divisible_by_the_accumulation_steps_are_padded_and_train_the_same(gw, tiny, tmp_path,
                                                                                   compacted_rows):
    """5 rollouts = 10 rows, 3 accumulation steps: TRL's split would drop a remainder, so the
    generation batch is padded with 2 empty rows; the update still equals update_policy's."""
    from rowgrove.train.update import update_policy

    model0, tok = tiny
    keep = sorted({r.rollout_id for r in compacted_rows})[:5]
    rows = [r for r in compacted_rows if r.rollout_id in keep]
    assert len(rows) == 10
    start = params(model0)
    m = copy.deepcopy(model0)
    trainer = RowgroveGRPOTrainer(m, args=grpo_args(tmp_path, gradient_accumulation_steps=3),
                                  rows_fn=lambda p, t: rows, train_dataset=dataset(PROMPTS * 3), processing_class=tok)
    trainer.train()
    # TRL's buffered micro-batches: 12 rows (10 + 2 empty) in 3 chunks of 4
    assert [len(b["completion_ids"]) for b in trainer._buffered_inputs] == [4, 4, 4]
    assert sum(int(b["tool_mask"].sum()) for b in trainer._buffered_inputs) == sum(int(np.sum(r.loss_mask)) for r in rows)
    got = params(m) - start
    m = copy.deepcopy(model0)
    update_policy(m, torch.optim.SGD(m.parameters(), lr=0.5), assign_advantages(rows), rollouts_per_minibatch=1000,
                  microbatch_tokens=256, clip_eps=0.2, max_grad_norm=0.0)
    want = params(m) - start
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_refused_settings_are_named(tiny, tmp_path):
    model, tok = tiny
    for kw, words in ((dict(loss_type="grpo"), "loss_type='dapo'"), (dict(beta=0.04), "beta=0.0"),
                      (dict(steps_per_generation=4), "steps_per_generation == gradient_accumulation_steps"),
                      (dict(importance_sampling_level="sequence", loss_type="grpo"), "importance_sampling_level")):
        with pytest.raises(InputError, match=words.replace("(", r"\(").replace(")", r"\)")):
            RowgroveGRPOTrainer(model, args=grpo_args(tmp_path, **kw), rows_fn=lambda p, t: [],
                                train_dataset=dataset(PROMPTS), processing_class=tok)
    with pytest.raises(InputError, match="seq-mean-token-mean divides by rows"):
        RowgroveGRPOTrainer(model, args=grpo_args(tmp_path), rows_fn=lambda p, t: [], loss_mode="seq-mean-token-mean",
                            train_dataset=dataset(PROMPTS), processing_class=tok)


def test_rows_without_group_ids_are_refused_with_algos_message(tiny, tmp_path):
    model, tok = tiny
    bad = [Row("x", None, [1, 2, 3, 4], [0, 0, 1, 1], reward=1.0, logprobs=[0, 0, -1, -1])]
    trainer = RowgroveGRPOTrainer(copy.deepcopy(model), args=grpo_args(tmp_path), rows_fn=lambda p, t: bad,
                                  train_dataset=dataset(PROMPTS), processing_class=tok)
    with pytest.raises(InputError, match="group_id missing for 1 of 1 valid rollouts"):
        trainer.train()
