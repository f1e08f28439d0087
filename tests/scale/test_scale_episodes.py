"""Episode tasks and the trainer's view of them, without Ray: a failure comes back as a masked
outcome (no rows, reward None, never 0), and masked outcomes become invalid RolloutRows."""

from __future__ import annotations

import socket

from rowgrove.agents.loop import EpisodeResult
from rowgrove.gateway.testing import start_gateway
from rowgrove.scale import EpisodeJob, HarnessResult, ScriptedHarness
from rowgrove.scale.episodes import EpisodeOutcome, run_episode
from rowgrove.train.ray_rollouts import RayRollouts


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_gateway_masks_the_episode():
    job = EpisodeJob(key="j", group_id="g", harness=ScriptedHarness(["hi"], 1.0))
    out = run_episode(f"http://127.0.0.1:{_closed_port()}", job, 3, 1)
    assert out.mask_reason.startswith("episode_failed at create: ConnectError")
    assert out.reward is None and out.rows == [] and (out.slot, out.generation) == (3, 1)


async def _raises(base_url: str, api_key: str) -> HarnessResult:
    raise RuntimeError("the sandbox fell over")


def test_a_harness_that_raises_masks_its_rollout_and_a_good_one_reads_back_rows(tmp_path):
    with start_gateway("tiny", "scripted", tmp_path / "l.sqlite", model_name="policy") as gw:
        bad = run_episode(gw.url, EpisodeJob(key="b", group_id="g", harness=_raises), 0, 0)
        good = run_episode(gw.url, EpisodeJob(key="a", group_id="g", harness=ScriptedHarness(["x", "y"], 0.5)), 0, 0)
    assert bad.mask_reason == "episode_failed at harness: RuntimeError: the sandbox fell over"
    assert bad.rollout_id and bad.reward is None and bad.rows == []
    assert good.mask_reason is None and good.reward == 0.5 and good.calls == 2
    assert len(good.rows) == 1 and good.rows[0].rollout_id == good.rollout_id  # one chain: one row
    assert good.metrics["generated_tokens"] == int(good.rows[0].loss_mask.sum())


def test_ray_rollouts_turn_masked_outcomes_into_invalid_rollouts_without_rows(tmp_path):
    with start_gateway("tiny", "scripted", tmp_path / "l.sqlite", model_name="policy") as gw:
        good = run_episode(gw.url, EpisodeJob(key="a", group_id="g", harness=ScriptedHarness(["x"], 1.0)), 0, 0)
    lost = EpisodeOutcome(key="b", group_id="g", slot=1, generation=0, rollout_id="ro_lost", reward=None,
                          mask_reason="gateway_died: gateway 1 (actor generation 0) was lost before this rollout finished")
    results = [EpisodeResult(messages=[], reward=float("nan") if o.reward is None else o.reward, actions=0, rejected=0,
                             compactions=0, calls=o.calls, valid=o.mask_reason is None,
                             info={"rollout_id": o.rollout_id, "outcome": o}) for o in (lost, good)]
    rows, built = RayRollouts.rows(object.__new__(RayRollouts), results)
    assert [r.rollout_id for r in rows] == [f"000001:{good.rollout_id}"]  # job position prefixed
    assert not built[0].valid and built[0].rows == [] and built[0].reason_kinds == ["gateway_died"]
    assert built[1].valid and built[1].rows == good.rows
