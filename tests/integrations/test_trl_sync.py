"""RowgroveGRPOTrainer keeps the gateway's engine on its weights (`gateway_url`), and says each
step how on-policy it was.

A real gateway on loopback serves the tiny model through the hf engine (a second copy of the
SAME initial weights); rows come from a compaction agent (keep_last_rounds, so each rollout is
two rows or more: a random model's text may also re-render differently, which starts a root) talking to it with the official OpenAI SDK; TRL trains with Adam at a learning rate
that moves every weight. At each step's start, the rows' engine logprobs are compared with the
trainer model's own on the same ids: equal within 1e-3 when synced; without `gateway_url` the
gap opens from the second step on, and the trainer warns. A sync the gateway refuses, or one
whose probe shows other weights, raises and stops training.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

pytestmark = pytest.mark.trainers

try:
    import trl  # noqa: F401
except ImportError:
    from rg_integration_env import require_or_skip

    require_or_skip("TRL is not installed: pip install 'rowgrove[trl]'")

from trl_agents import compaction_agent, engine_gap  # noqa: E402
from rowgrove.engines.hf import HFEngine  # noqa: E402
from rowgrove.errors import EngineError, InputError, RowgroveError  # noqa: E402
from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.integrations.harness import rollouts_to_rows  # noqa: E402
from rowgrove.integrations.trl import NO_SYNC_WARNING, RowgroveGRPOTrainer, WeightSyncError, check_config  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PROMPTS = ["Count the apples.", "Name a city."]
TOL = 1e-3
STEPS = 3




def grpo_args(tmp_path, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), loss_type="dapo", beta=0.0, learning_rate=1e-2,
                optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
                max_grad_norm=0.0, per_device_train_batch_size=2, gradient_accumulation_steps=2, num_generations=2,
                max_steps=STEPS, report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, bf16=False,
                disable_tqdm=True, max_completion_length=64, seed=0)
    base.update(kw)
    return GRPOConfig(**base)


def dataset(prompts):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": list(prompts)})


@pytest.fixture(scope="module")
def tiny():
    from rowgrove.model.load import load_model

    return load_model("tiny")


def run_loop(tiny, tmp_path, *, synced: bool, engine_cls=HFEngine, steps: int = STEPS, **trainer_kw):
    """Train `steps` steps against a gateway whose hf engine holds a copy of the trainer's initial
    weights; returns (trainer, per-step gaps at the step's start, the gap of a fresh call after
    train() or the exception train() raised, rows_fn calls, the initial model)."""
    model0, tok = tiny
    model = copy.deepcopy(model0)
    engine = engine_cls(copy.deepcopy(model0).eval(), tok, max_batch=8)
    agent = compaction_agent()
    out: dict = {"gaps": [], "calls": 0, "error": None}
    with start_gateway("tiny", engine=engine, ledger=tmp_path / "ledger.db") as gw:
        def rows_fn(prompts, trainer):
            out["calls"] += 1
            rows = rollouts_to_rows(gw.url, prompts, agent)
            assert len(rows) >= 2 * len(prompts)  # the compaction: two rows or more per rollout
            out["gaps"].append(engine_gap(trainer.trainer_logprobs, rows))
            return rows

        trainer = RowgroveGRPOTrainer(model, args=grpo_args(tmp_path, max_steps=steps), rows_fn=rows_fn,
                                      train_dataset=dataset(PROMPTS * 2), processing_class=tok,
                                      gateway_url=gw.url if synced else None, **trainer_kw)
        try:
            trainer.train()
        except RowgroveError as e:
            out["error"] = e
        else:
            fresh = rollouts_to_rows(gw.url, ["one more prompt"], agent)
            out["fresh_gap"] = engine_gap(trainer.trainer_logprobs, fresh)
            out["fresh_gap_initial_model"] = engine_gap(lambda ids: _logprobs(model0, ids), fresh)
    out["trainer"] = trainer
    return out


def _logprobs(model, ids):
    from rowgrove.engines.verify import policy_logprobs

    return policy_logprobs(model, ids)


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def test_synced_every_step_the_rows_are_the_trainers_policy(tiny, tmp_path, recwarn):
    out = run_loop(tiny, tmp_path, synced=True)
    trainer = out["trainer"]
    print("synced: gap at each step's start", out["gaps"], "fresh call after train()", out["fresh_gap"])
    assert out["error"] is None and trainer.state.global_step == STEPS
    assert len(out["gaps"]) == STEPS and max(out["gaps"]) <= TOL
    assert out["fresh_gap"] <= TOL
    # the weights moved: the initial model is far from what the engine samples with now
    assert out["fresh_gap_initial_model"] > 1e-2
    # a sync at the start, after each step; the end's is the last step's (nothing moved since)
    assert [s for s, _ in trainer.syncs] == [0, 1, 2, 3]
    assert [r.version for _, r in trainer.syncs] == [1, 2, 3, 4]
    assert all(r.gap <= TOL and r.probe_tokens > 0 for _, r in trainer.syncs)
    assert logged(trainer, "rowgrove/weight_version_lag") == [0.0] * STEPS
    gaps = logged(trainer, "rowgrove/max_logprob_gap")
    assert len(gaps) == STEPS and max(gaps) <= TOL
    assert not [w for w in recwarn if NO_SYNC_WARNING[:40] in str(w.message)]
    # the two newest checkpoints are kept, the config beside them
    assert sorted(p.name for p in (tmp_path / "out" / "rowgrove-weights").iterdir()) == ["config", "v000003", "v000004"]


def test_without_gateway_url_it_warns_and_the_gap_shows(tiny, tmp_path):
    with pytest.warns(UserWarning, match="without gateway_url: nothing keeps the engine"):
        out = run_loop(tiny, tmp_path, synced=False)
    trainer = out["trainer"]
    print("unsynced: gap at each step's start", out["gaps"], "fresh call after train()", out["fresh_gap"])
    assert out["error"] is None and trainer.state.global_step == STEPS and trainer.syncs == []
    assert out["gaps"][0] <= TOL  # the same initial weights
    # The trainer's weights move from the first step with a gradient on (Adam keeps moving them
    # after it): a step whose rollouts all tie, or are invalid, has grad_norm 0 and moves nothing.
    # From then on the engine, never synced, samples from other weights than the trainer's.
    norms = logged(trainer, "grad_norm")
    moved = [any(n > 0 for n in norms[:i]) for i in range(STEPS)]
    assert any(norms), norms
    assert [g > TOL for g in out["gaps"]] == moved, (out["gaps"], norms)
    assert out["fresh_gap"] > TOL
    assert logged(trainer, "rowgrove/weight_version_lag") == [0.0, 1.0, 2.0]
    gaps = logged(trainer, "rowgrove/max_logprob_gap")
    assert [g > TOL for g in gaps] == moved, (gaps, norms)


class _FailsAfterFirstLoad(HFEngine):
    """Loads the first checkpoint (the sync at the start), then fails as a full disk would."""

    loads = 0

    def update_weights(self, state_dict):
        self.loads += 1
        if self.loads > 1:
            raise EngineError("cannot copy the weights: no space left on device (test)")
        super().update_weights(state_dict)


class _IgnoresWeights(HFEngine):
    """Answers every update and bumps its version, but keeps sampling with its old weights."""

    def update_weights(self, state_dict):
        self.weights_version += 1


def test_a_sync_the_gateway_refuses_stops_training(tiny, tmp_path):
    out = run_loop(tiny, tmp_path, synced=True, engine_cls=_FailsAfterFirstLoad)
    e = out["error"]
    assert isinstance(e, WeightSyncError), e
    msg = str(e)
    print("training stopped:", msg)
    assert "/v1/weights answered 502" in msg and "no space left on device" in msg and "off-policy" in msg
    assert out["trainer"].state.global_step == 1 and out["calls"] == 1  # no rows sampled after the failure


def test_a_sync_whose_probe_shows_other_weights_stops_training(tiny, tmp_path):
    out = run_loop(tiny, tmp_path, synced=True, engine_cls=_IgnoresWeights)
    e = out["error"]
    assert isinstance(e, WeightSyncError), e
    msg = str(e)
    print("training stopped:", msg)
    assert "weight version 2" in msg and "differ from the trainer's by up to" in msg and "tolerance 0.001" in msg
    assert out["trainer"].state.global_step == 1 and out["calls"] == 1
    assert [s for s, _ in out["trainer"].syncs] == [0]  # the start's passed: same weights then


def test_trls_vllm_server_is_taken_only_with_a_gateway_in_server_mode(tmp_path):
    """TRL's vLLM (generation by TRL, weights over NCCL) is accepted only as the server the
    gateway's vllm engine samples from; the NCCL transfer itself runs in scripts/gpu_check.sh."""
    check_config(grpo_args(tmp_path, use_vllm=True, vllm_mode="server"), "http://127.0.0.1:8000")
    for kw, url in ((dict(use_vllm=True, vllm_mode="server"), None),
                    (dict(use_vllm=True, vllm_mode="colocate"), "http://127.0.0.1:8000")):
        with pytest.raises(InputError, match="use_vllm=True only with vllm_mode='server'"):
            check_config(grpo_args(tmp_path, **kw), url)


# ---- PEFT: the adapters merged into what the engine samples with ---------------------------------

LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def _lora(model):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(copy.deepcopy(model), LoraConfig(**LORA))


def test_a_lora_trainer_keeps_the_engine_on_base_plus_adapter(tiny, tmp_path):
    """TRL wraps the model in a LoRA adapter (peft_config); each sync writes the base weights with
    the adapter merged in, under the base model's names, and the probe (and every step's rows)
    show the engine sampling with what the trainer's forward computes."""
    pytest.importorskip("peft")
    from peft import LoraConfig
    from safetensors import safe_open

    model0, _ = tiny
    out = run_loop(tiny, tmp_path, synced=True, peft_config=LoraConfig(**LORA))
    trainer = out["trainer"]
    print("lora synced: gaps", out["gaps"], "fresh", out["fresh_gap"], "vs initial", out["fresh_gap_initial_model"])
    assert out["error"] is None and trainer.state.global_step == STEPS
    assert type(trainer.model).__name__.startswith("Peft")
    assert [s for s, _ in trainer.syncs] == [0, 1, 2, 3] and all(r.gap <= TOL for _, r in trainer.syncs)
    assert max(out["gaps"]) <= TOL and out["fresh_gap"] <= TOL
    assert out["fresh_gap_initial_model"] > 1e-3  # the adapter moved what the engine samples
    # the checkpoint is the base architecture's: its names, no adapter tensor
    newest = max((tmp_path / "out" / "rowgrove-weights").glob("v*"))
    names = set()
    for f in newest.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            names |= set(st.keys())
    base = set(model0.state_dict())
    assert names and not any("lora" in n or "base_layer" in n for n in names), sorted(names)[:5]
    assert names <= base and base - names <= {"lm_head.weight"}, sorted(base ^ names)[:5]
    # the trainer's own model is left unmerged (training goes on through the adapter)
    assert not any(getattr(m, "merged", False) for m in trainer.model.modules())


def test_engine_weights_of_a_lora_model_are_merge_and_unload_and_leave_it_unmerged(tiny):
    pytest.importorskip("peft")
    from rowgrove.integrations.gateway_sync import engine_weights

    model0, _ = tiny
    peft_model = _lora(model0)
    with torch.no_grad():  # a trained adapter: B is zero at init, which would merge to the base
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.tensor([[5, 9, 13, 2, 7]])
    before = peft_model(ids).logits.detach().clone()
    want = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    with engine_weights(peft_model) as got:
        assert set(got) == set(want)
        assert all(torch.equal(got[k], want[k]) for k in want)
        assert not torch.equal(got["model.layers.0.self_attn.q_proj.weight"],
                               model0.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    assert not any(getattr(m, "merged", False) for m in peft_model.modules())
    torch.testing.assert_close(peft_model(ids).logits, before, atol=1e-5, rtol=0)
    # a plain model: its own state dict
    with engine_weights(model0) as plain:
        assert plain.keys() == model0.state_dict().keys()


def test_a_prompt_learning_adapter_is_refused_with_the_reason(tiny):
    pytest.importorskip("peft")
    from peft import PromptTuningConfig, get_peft_model

    from rowgrove.integrations.gateway_sync import engine_weights

    model0, _ = tiny
    pt = get_peft_model(copy.deepcopy(model0), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    with pytest.raises(WeightSyncError, match="prompt learning: it adds virtual tokens") as e:
        with engine_weights(pt):
            pass
    assert "PROMPT_TUNING" in str(e.value) and "LoRA-family adapter" in str(e.value)
