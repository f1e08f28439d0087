"""The visual task end to end on the CPU: the `shapes` env's screens (drawn on the spot) go through
the reference harness, which keeps only the newest image, to a real gateway serving the tiny VLM
(scripted answers, the model's own logprobs with the images in context); the rollouts become rows
carrying their images; the reference update trains on them for two steps, and the new weights
reach the engine.

Pinned: every call of a rollout is a root (each context drops the screen the previous call saw),
so a rollout of 3 screens is 3 rows, each holding exactly one image; the vision tower's weights
move; the engine serves the updated weights afterwards."""

from __future__ import annotations

import asyncio
import copy
import json
import random

import numpy as np
import pytest
import torch

from rowgrove.agents import AgentConfig, RolloutJob, run_rollouts_concurrently
from rowgrove.algo import assign_advantages
from rowgrove.engines.scripted import ScriptedEngine
from rowgrove.envs import ShapesEnv, make_shapes_tasks
from rowgrove.envs.shapes import MAX_SHAPES
from rowgrove.gateway.testing import start_gateway
from rowgrove.ledger import Ledger
from rowgrove.model.load import load_model, model_dir
from rowgrove.train.loop import collect_rows, row_vision_inputs
from rowgrove.train.update import update_policy


def _answer(count: int) -> str:
    return "<tool_call>\n" + json.dumps({"name": "answer", "arguments": {"count": count}}) + "\n</tool_call>"


def test_shapes_screens_are_deterministic_and_the_expert_scores_one():
    (task,) = make_shapes_tasks(1, seed=3)
    assert make_shapes_tasks(1, seed=3)[0] == task
    env = ShapesEnv()
    first = env.reset(task)
    assert first[0]["type"] == "image_url" and first[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert ShapesEnv().reset(task) == first
    done = False
    while not done:
        name, args = env.expert_action()
        done = env.step(name, args).done
    assert env.reward() == 1.0


@pytest.mark.slow
def test_two_grpo_steps_on_the_visual_task(tmp_path):
    torch.set_num_threads(1)
    policy, tok = load_model("tiny-vl")
    engine = ScriptedEngine(copy.deepcopy(policy).eval(), tok, workers=1)
    agent = AgentConfig(compaction="keep_newest_image", max_actions=3, max_resamples=0, max_tokens=48)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    vision_before = {n: p.detach().clone() for n, p in policy.named_parameters() if "visual" in n}
    with start_gateway(str(model_dir("tiny-vl")), engine=engine, ledger=tmp_path / "ledger.db") as gw:
        ledger = Ledger(tmp_path / "ledger.db", readonly=True)
        for step in (1, 2):
            tasks = make_shapes_tasks(2, seed=step)
            jobs = []
            for i, task in enumerate(tasks):
                for k in range(2):
                    rng = random.Random(step * 100 + i * 10 + k)
                    jobs.append(RolloutJob(group_id=f"s{step}-p{i}", env=ShapesEnv(), task=task, config=agent,
                                           extra_body=lambda a, att, rng=rng: {"script": _answer(rng.randint(0, MAX_SHAPES))}))
            results = asyncio.run(run_rollouts_concurrently(gw.url, jobs, 2))
            assert all(r.valid and r.actions == 3 for r in results)
            rows, built = collect_rows(ledger, results)
            assert len(rows) == 3 * len(results)                      # every call a root: one row per call
            assert all(len(r.images) == 1 for r in rows)              # each context shows the newest screen only
            assert all(b.metrics.get("roots") == 3 for b in built)
            rows = assign_advantages(rows)
            stats = update_policy(policy, optimizer, rows, rollouts_per_minibatch=4, max_grad_norm=1.0,
                                  vision_inputs=row_vision_inputs(tok, ledger))
            assert stats["tokens_trained"] > 0 and np.isfinite(stats["loss"])
            policy.eval()
            engine.update_weights(policy.state_dict())
        ledger.close()
    assert engine.weights_version == 2
    moved = [n for n, p in policy.named_parameters() if n in vision_before and not torch.equal(p, vision_before[n])]
    assert moved, "the vision tower did not train"
    served = dict(engine.model.named_parameters())
    assert all(torch.equal(served[n], p) for n, p in policy.named_parameters())
    asyncio.run(engine.aclose())
