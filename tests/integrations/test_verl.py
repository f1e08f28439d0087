"""verl's own loss code computes rowgrove's loss on rows from `rows_to_dataproto`.

The verl side (tests/integrations/verl_side.py) runs in verl's environment (.venv-stack-verl, made by
scripts/install_verl_env.sh: verl 0.9.1 caps transformers < 5.11) and reports numbers; these tests
assert on them. Ten rollouts in groups of 3, 2, 1 and 4, split into 1, 2, 3 or 4 rows each.
"""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from rg_integration_env import ROOT, require_or_skip, verl_python

pytestmark = pytest.mark.trainers


@pytest.fixture(scope="module")
def verl_run() -> dict:
    py = verl_python()
    if not py.exists():
        require_or_skip(f"no verl environment at {py}: run scripts/install_verl_env.sh "
                        "(or set ROWGROVE_VERL_PYTHON)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([str(py), str(ROOT / "tests" / "integrations" / "verl_side.py")], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_rollouts_are_split_into_one_to_four_rows_in_uneven_groups(verl_run):
    assert sorted(set(verl_run["rows_per_rollout"].values())) == [1, 2, 3, 4]
    assert verl_run["group_sizes"] == [3, 2, 1, 4]


def test_verl_policy_loss_gradient_equals_rowgrove_under_every_micro_batching(verl_run):
    grads = verl_run["grad_rel_diff"]
    # both loss modes x both aggregations x split/unsplit x micro-batching (1, 2, dynamic) x dp (1, 2)
    assert len(grads) >= 32
    assert any("micro=dynamic/dp=2" in k for k in grads) and any("micro=2" in k for k in grads)
    # also through ppo_loss, the function verl's FSDP engine calls per micro-batch (no-padding layout)
    assert sum(k.startswith("ppo_loss/") for k in grads) == 32
    for case, diff in grads.items():
        assert diff < 1e-6, f"{case}: verl's gradient differs from rowgrove's by {diff:.2e} (relative)"
    # the control: verl's grpo + vanilla + seq-mean-token-mean on the same split batch is far off
    assert verl_run["control_grad_rel_diff"] > 0.1


def test_registered_estimator_reproduces_the_dataproto_advantages(verl_run):
    for case, diff in verl_run["estimator_max_abs_diff"].items():
        assert diff < 1e-7, case


def test_a_rollouts_total_weight_does_not_change_when_it_is_split(verl_run):
    sums = verl_run["coef_sum"]
    for mode in ("token-mean", "rollout-mean"):
        for agg in ("token-sum", "token-mean"):
            split, unsplit = sums[f"{mode}/{agg}/split"], sums[f"{mode}/{agg}/unsplit"]
            assert split.keys() == unsplit.keys()
            for rid in split:
                assert split[rid] == pytest.approx(unsplit[rid], rel=1e-6, abs=1e-9), (mode, agg, rid)


def test_hand_example_rowgrove_against_verls_builtin_grpo_and_seq_mean_token_mean(verl_run):
    """Group q: rollout a (reward 1) compacted into 3 rows, rollout b (reward 0) one row.

    rowgrove: rewards [1, 0], mean 1/2, sample std sqrt(1/2) -> A = +-1/sqrt(2) = +-0.70711 (eps 1e-6).
    rollout-mean: R = 2; a has 6 generated tokens, b 5: coefficient A/(2*6) = 0.058926 on a's tokens,
    -A/(2*5) = -0.070711 on b's; each rollout's coefficients sum to A/2 = +-0.35355.
    verl's grpo over rows: rewards [1, 1, 1, 0], mean 3/4, std sqrt((3/16 + 9/16)/3) = 1/2 ->
    a's rows +0.5, b -1.5: a's reward counted three times. seq-mean-token-mean over the 4 rows: each
    row weighs 1/4, so a weighs 3/4 and b 1/4 (rowgrove: 1/2 each). This documents verl's bias; it
    is not a failure of verl's code.
    """
    hand = verl_run["hand"]
    assert hand["rows"] == ["a", "a", "a", "b"]
    s = 1 / math.sqrt(0.5) * 0.5  # (r - mean) / std = 0.5 / sqrt(1/2)
    assert hand["rowgrove_adv"] == pytest.approx([s, s, s, -s], rel=1e-5)
    assert hand["coef"][0] == pytest.approx([s / 12, s / 12], rel=1e-5)
    assert hand["coef"][3] == pytest.approx([-s / 10] * 5, rel=1e-5)
    assert hand["coef_sum"] == pytest.approx({"a": s / 2, "b": -s / 2}, rel=1e-5)
    assert hand["verl_grpo"] == pytest.approx([0.5, 0.5, 0.5, -1.5], rel=1e-5)
    assert hand["verl_seq_mean_token_mean_mass"] == pytest.approx({"a": 0.75, "b": 0.25})


def test_builtin_grpo_baseline_over_rows_differs_from_rowgrove_on_the_random_batch(verl_run):
    """On the 10-rollout batch, verl's grpo (per row) disagrees with rowgrove's per-rollout
    advantage wherever a group holds rollouts with different row counts and rewards."""
    rows, got, want = verl_run["row_rollout"], verl_run["verl_grpo_row_adv"], verl_run["rowgrove_adv"]
    differ = {rid for rid, a in zip(rows, got, strict=True) if abs(a - want[rid]) > 1e-3}
    assert differ, "verl's grpo over rows matched rowgrove on a split batch"
    # the singleton group g2 (one rollout, two rows) gets 0 either way
    assert want["r2-0"] == 0.0 and all(a == 0.0 for rid, a in zip(rows, got, strict=True) if rid == "r2-0")


def test_dataproto_layout_and_dropped_rows(verl_run):
    r = verl_run["row0"]
    start = r["loss_mask"].index(1)
    n = len(r["input_ids"]) - start
    assert r["prompts"] == r["input_ids"][:start]  # the longest prompt here: no left padding
    assert r["responses"][:n] == r["input_ids"][start:] and set(r["responses"][n:]) <= {0}
    assert r["response_mask"][:n] == r["loss_mask"][start:] and set(r["response_mask"][n:]) <= {0}
    assert r["attention_mask"][: len(r["input_ids"])] == [1] * len(r["input_ids"])
    assert r["position_ids"][: len(r["input_ids"])] == list(range(len(r["input_ids"])))
    assert r["uid"] == "g0" and r["uid_type"] == "RolloutKey"
    assert {"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids",
            "rollout_log_probs", "old_log_probs", "advantages", "token_level_rewards"} <= set(verl_run["fields"])
    assert verl_run["non_tensor"] == ["rollout_id", "uid"]
    assert verl_run["dropped"]["dropped_invalid_rows"] == 1 and verl_run["dropped"]["rollouts"] == 10
    assert verl_run["partial_group_max_abs_diff"] == 0.0  # the invalid rollout takes no part in g0's baseline


def test_refusals_name_the_setting_and_use_algos_messages(verl_run):
    ref = verl_run["refusals"]
    assert "token-sum" in ref["seq-agg"] and "divide by rows" in ref["seq-agg"]
    assert "token-mean, rollout-mean" in ref["seq-mode"]
    assert ref["no-group"] == ref["algo-no-group"]  # the same message as rowgrove.algo
    assert "plain ids" in ref["plain-uid"]
    assert "token-sum" in ref["loss-agg"]
    for setting in ("algorithm.adv_estimator=rowgrove", "policy_loss.loss_mode=rowgrove", "use_kl_loss=false",
                    ">= 12 rows (is 8)"):
        assert setting in ref["config"]


@pytest.fixture(scope="module")
def agent_loop_run(tmp_path_factory) -> dict:
    """verl's own LLMServerClient, load balancer and agent-loop manager/worker classes as Ray actors,
    in verl's environment (tests/integrations/verl_agent_side.py says what is verl's and what stands in)."""
    py = verl_python()
    if not py.exists():
        require_or_skip(f"no verl environment at {py}: run scripts/install_verl_env.sh (or set ROWGROVE_VERL_PYTHON)")
    tmp = tmp_path_factory.mktemp("verl-loop")
    path = [str(ROOT / "src"), str(ROOT / "tests" / "integrations")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(path)}
    proc = subprocess.run([str(py), str(ROOT / "tests" / "integrations" / "verl_agent_side.py"), str(tmp)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def test_a_rollout_split_into_three_rows_arrives_as_three_sequences(agent_loop_run):
    out = agent_loop_run
    assert out["manager_worker_class"] == "RowgroveAgentLoopManager"
    # 2 prompts x rollout.n=2: the "compact" prompt's rollouts became 3 rows each, the other's 1
    assert out["sequences"] == 8
    per = {rid: out["rollout_id"].count(rid) for rid in out["rollout_id"]}
    assert sorted(per.values()) == [1, 1, 3, 3]
    for rid, k in per.items():
        rows = [i for i, r in enumerate(out["rollout_id"]) if r == rid]
        assert [out["segment"][i] for i in rows] == list(range(k))
        assert len({out["uid"][i] for i in rows}) == 1  # one group per prompt, every row of a rollout in it
        want = "compact this: count to three" if k == 3 else "count to one"
        assert {out["raw_prompt"][i] for i in rows} == {want}
    assert out["uid_type"] == ["RolloutKey"]
    assert out["meta"]["rollouts"] == 4 and out["meta"]["dropped_invalid_sequences"] == 0


def test_the_weights_of_a_rollouts_rows_sum_to_its_share(agent_loop_run):
    out = agent_loop_run
    assert out["weights_off_mask"] == 0.0
    # rollout-mean (the loop's loss_mode): each of the 4 rollouts weighs 1/4, however many rows
    assert out["meta"]["loss_mode"] == "rollout-mean"
    for rid, s in out["weight_sum"].items():
        assert s == pytest.approx(0.25, rel=1e-6), rid
    # token-mean: a rollout's share is its generated tokens over the update's
    total = sum(out["generated_tokens"].values())
    for rid, s in out["token_mean_weight_sum"].items():
        assert s == pytest.approx(out["generated_tokens"][rid] / total, rel=1e-6), rid
    # verl's compute_advantage("rowgrove") on the manager's batch: A of the rollout times its share
    rewards = out["rewards"]
    for rid, adv in out["advantage_sum"].items():
        group = [r for r in rewards if out["uid"][out["rollout_id"].index(r)] == out["uid"][out["rollout_id"].index(rid)]]
        rs = [rewards[r] for r in group]
        mean = sum(rs) / len(rs)
        std = (sum((x - mean) ** 2 for x in rs) / (len(rs) - 1)) ** 0.5
        a = (rewards[rid] - mean) / (std + 1e-6)
        assert adv == pytest.approx(a * out["token_mean_weight_sum"][rid], abs=1e-6), rid


def test_every_sampled_token_came_from_verls_server_manager_at_global_steps(agent_loop_run):
    out = agent_loop_run
    server = out["server"]
    # 3 + 3 + 1 + 1 calls, every one through LLMServerClient.generate -> the replica
    assert server["calls"] == 8
    calls = sorted((ids, lps) for ids, lps in server["outputs"])
    seqs = sorted((ids, lps) for ids, lps in out["sampled"])
    # each row trains exactly one call's sampled ids, with the server's logprobs (float32 in the batch)
    assert [ids for ids, _ in seqs] == [ids for ids, _ in calls]
    for (_, got), (_, want) in zip(seqs, calls, strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert out["min_global_steps"] == [3] * 8 and out["max_global_steps"] == [3] * 8


def test_verls_stock_worker_refuses_a_rollout_of_several_rows_naming_the_manager(agent_loop_run):
    err = agent_loop_run["stock_error"]
    assert err is not None and "InputError" in err and "became 3 rows" in err
    assert "agent_loop_manager_class=rowgrove.integrations.verl_manager.RowgroveAgentLoopManager" in err
