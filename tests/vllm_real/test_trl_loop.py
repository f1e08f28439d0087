"""A closed loop with a real engine: TRL's GRPOTrainer (RowgroveGRPOTrainer) trains on rows a
compaction agent sampled through the gateway in front of a real `vllm serve` (vLLM's CPU build,
the untied tiny model: a tied one reloads with a stale output layer on this build, see
docs/engines.md), and after every optimizer step the trainer's weights reach that server through
the gateway's weight route (a checkpoint folder, vLLM's reload, the gateway's check of the server
against the folder, then the trainer's probe against its own logprobs), within the default sync
tolerance docs/engines.md gives (1e-3; fp32 on both sides agrees within ~1e-6).

Per-step figures (weight-version lag, largest engine-vs-trainer logprob gap of the first
micro-batch, the sync's probe gap and seconds) are printed: run with -s to see them. The server
gets its starting weights back at the end.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import httpx
import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL is not installed: pip install 'rowgrove[trl]'")

from rowgrove.engines import make_engine  # noqa: E402
from rowgrove.engines.verify import DEFAULT_SYNC_TOLERANCE, policy_logprobs  # noqa: E402
from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.integrations.harness import rollouts_to_rows  # noqa: E402
from rowgrove.integrations.trl import RowgroveGRPOTrainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integrations"))
from trl_agents import compaction_agent, engine_gap  # noqa: E402

STEPS = 3
TOL = DEFAULT_SYNC_TOLERANCE


@pytest.fixture(scope="module")
def untied_server(vllm_py, models, tmp_path_factory):
    """Only the server this loop samples from (`make test` runs this module on its own, from TRL's
    environment: the suite's session fixture `servers` would start the tied model's too)."""
    from rowgrove.engines.launch import start_vllm

    server = start_vllm(models["untied"], python=vllm_py, log_path=tmp_path_factory.mktemp("vllm-logs") / "untied.log",
                        omp_threads=1)
    try:
        yield server
    finally:
        server.stop()


def test_trl_trains_three_steps_on_a_real_vllm_server_kept_in_step(untied_server, models, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    torch.set_num_threads(1)
    folder = models["untied"]
    model0 = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = copy.deepcopy(model0)
    engine = make_engine("vllm", str(folder), url=untied_server.url)
    agent = compaction_agent()
    starts: list[float] = []
    args = GRPOConfig(output_dir=str(tmp_path / "out"), loss_type="dapo", beta=0.0, learning_rate=1e-2,
                      optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                      max_grad_norm=0.0, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                      num_generations=2, max_steps=STEPS, report_to="none", save_strategy="no", logging_steps=1,
                      use_cpu=True, bf16=False, disable_tqdm=True, max_completion_length=64, seed=0)
    with start_gateway(str(folder), engine=engine, ledger=tmp_path / "ledger.db") as gw:
        try:
            def rows_fn(prompts, trainer):
                rows = rollouts_to_rows(gw.url, prompts, agent)
                starts.append(engine_gap(trainer.trainer_logprobs, rows))
                return rows

            trainer = RowgroveGRPOTrainer(model, args=args, rows_fn=rows_fn,
                                          train_dataset=Dataset.from_dict({"prompt": ["Count to three.", "Name a city."] * 2}),
                                          processing_class=tok, gateway_url=gw.url)
            trainer.train()
            fresh = rollouts_to_rows(gw.url, ["one more prompt"], agent)
            fresh_gap = engine_gap(trainer.trainer_logprobs, fresh)
            initial_gap = engine_gap(lambda ids: policy_logprobs(model0, ids), fresh)
        finally:
            r = httpx.post(f"{gw.url}/v1/weights", json={"path": str(folder)}, timeout=300)
            assert r.status_code == 200, r.text

    logs = [h for h in trainer.state.log_history if "rowgrove/weight_version_lag" in h]
    print(f"\nTRL x real vLLM, {STEPS} steps, sync tolerance {TOL:g}")
    for k, h in enumerate(logs):
        print(f"  step {k + 1}: rows {h['rowgrove/rows']:.0f}  weight_version_lag {h['rowgrove/weight_version_lag']:.0f}"
              f"  max_logprob_gap {h['rowgrove/max_logprob_gap']:.2e}  gap at step start {starts[k]:.2e}"
              f"  sync_gap {h['rowgrove/sync_gap']:.2e}  sync_seconds {h['rowgrove/sync_seconds']:.2f}")
    print("  syncs (trainer step, version, probe gap, probe tokens, seconds):",
          [(s, r.version, f"{r.gap:.1e}", r.probe_tokens, round(r.seconds, 2)) for s, r in trainer.syncs])
    print(f"  after train(): a fresh call's gap {fresh_gap:.2e} (against the initial weights: {initial_gap:.2e})")

    assert trainer.state.global_step == STEPS
    assert [s for s, _ in trainer.syncs] == [0, 1, 2, 3] and [r.version for _, r in trainer.syncs] == [1, 2, 3, 4]
    assert all(r.gap <= TOL and r.probe_tokens > 0 for _, r in trainer.syncs)
    assert len(starts) == STEPS and max(starts) <= TOL
    assert [h["rowgrove/weight_version_lag"] for h in logs] == [0.0] * STEPS
    assert max(h["rowgrove/max_logprob_gap"] for h in logs) <= TOL
    assert fresh_gap <= TOL
    assert initial_gap > 1e-2, "the trainer's weights never moved"
