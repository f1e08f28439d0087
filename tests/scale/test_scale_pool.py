"""GatewayPool on a local Ray: 2 gateways serve 16 rollouts of 4 groups; rows merge across their
ledgers; advantages equal those of the same rollouts on one gateway; a gateway actor killed
mid-step masks its open rollouts (never reward 0), the step completes and the slot is refilled."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from rowgrove.algo import assign_advantages
from rowgrove.assemble import read_rows
from rowgrove.cli import main
from rowgrove.gateway.testing import start_gateway
from rowgrove.scale import EpisodeJob, GatewayPool, ScriptedHarness
from rowgrove.scale.episodes import run_episode

pytest.importorskip("ray", reason="the `ray` extra is not installed")

pytestmark = pytest.mark.ray

REWARDS = [1.0, 0.0, 0.5, 0.0]  # per job within a group; group g adds g: uneven means and stds


def jobs(n_groups=4, per_group=4, pause=0.0, turns=2):
    out = []
    for g in range(n_groups):
        for k in range(per_group):
            replies = [f"g{g} r{k} t{t}" for t in range(turns)]
            out.append(EpisodeJob(key=f"g{g}-{k}", group_id=f"g{g}",
                                  harness=ScriptedHarness(replies, REWARDS[k % 4] + g * (k % 2), pause=pause)))
    return out


@pytest.fixture(scope="module")
def pool(local_ray, tmp_path_factory):
    """One pool for the module (actors take seconds to start); the kill test runs last."""
    with GatewayPool(2, ledger_dir=tmp_path_factory.mktemp("pool"), gateway_cpus=0.25, max_in_flight=8) as p:
        yield p


def _by_key(outcomes, rows):
    key = {o.rollout_id: o.key for o in outcomes}
    return {(key[r.rollout_id], r.segment): r for r in rows}


def test_two_gateways_serve_a_step_like_one(pool, tmp_path):
    step = jobs()
    got = pool.run(step)
    ledgers = pool.ledgers
    assert len(got.outcomes) == 16 and not got.masked and got.replaced == []
    on = {k: {o.group_id for o in got.outcomes if o.slot == k} for k in (0, 1)}
    assert on[0] and on[1] and on[0] & on[1]  # both gateways served, and some group spans both
    rows = assign_advantages(got.rows)

    # the same 16 rollouts, one after another on one gateway in this process
    with start_gateway("tiny", "scripted", tmp_path / "one.sqlite", model_name="policy") as gw:
        alone = [run_episode(gw.url, j, 0, 0) for j in step]
    ref = assign_advantages([r for o in alone for r in o.rows])
    a, b = _by_key(got.outcomes, rows), _by_key(alone, ref)
    assert a.keys() == b.keys() and len(a) == 16
    for k in a:
        assert a[k].advantage == b[k].advantage, k  # the same floats, not merely close
        np.testing.assert_array_equal(a[k].input_ids, b[k].input_ids)
        np.testing.assert_array_equal(a[k].loss_mask, b[k].loss_mask)
    assert len({a[k].advantage for k in a}) > 2  # the groups' baselines are not trivial

    # rows merged from the two gateways' ledgers by the CLI: the same advantages
    assert len(ledgers) == 2
    out = tmp_path / "rows.parquet"
    assert main(["rows", *sum((["--ledger", p] for p in ledgers), []), "--out", str(out), "--quiet"]) == 0
    merged = {r.rollout_id: r.advantage for r in read_rows(out)}
    assert merged == {r.rollout_id: r.advantage for r in rows}


def test_a_gateway_killed_mid_step_masks_its_open_rollouts(local_ray, pool):
    step = jobs(n_groups=2, per_group=4, pause=0.4, turns=3)
    victim = pool.slots[1].actor

    def kill_when_busy():  # kill gateway 1 once it holds an open rollout
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if local_ray.get(victim.open_rollouts.remote()):
                pool.kill(1)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    got = pool.run(step)
    killer.join()
    assert got.replaced == [1]
    lost = [o for o in got.outcomes if o.slot == 1 and o.generation == 0 and o.mask_reason]
    assert lost and all(o.mask_reason.startswith("gateway_died: gateway 1") for o in lost)
    assert all(o.reward is None and o.rows == [] for o in got.masked)  # masked, never reward 0
    assert got.masked == lost  # nothing on gateway 0 was harmed
    kept = {r.rollout_id for r in got.rows}
    assert {o.rollout_id for o in got.outcomes if not o.mask_reason} == kept and kept
    assign_advantages(got.rows)  # the step's rows still make a step

    # the slot holds a live replacement with a fresh ledger, and it takes new rollouts
    assert pool.slots[1].generation == 1 and pool.slots[1].ledger.endswith("gateway-1.1.sqlite")
    again = pool.run(jobs(n_groups=1, per_group=4))
    assert not again.masked and {o.slot for o in again.outcomes} == {0, 1}
    assert {o.generation for o in again.outcomes if o.slot == 1} == {1}
