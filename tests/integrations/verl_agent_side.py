"""The verl side of the agent-loop test: instantiate the "rowgrove" agent loop the way verl's
AgentLoopWorker does (hydra.utils.instantiate on the registry entry, with verl's keyword
arguments) and run it against a rowgrove gateway whose URL is argv[1]; argv[2] is the tiny
model's folder (its tokenizer). Prints one JSON object."""

from __future__ import annotations

import asyncio
import json
import sys

from rowgrove.integrations.harness import Episode


async def two_calls(client, prompt):
    """Two calls in one context: one row."""
    msgs = list(prompt)
    r = await client.chat.completions.create(model="policy", messages=msgs, extra_body={"script": "first step"})
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go on"}]
    r = await client.chat.completions.create(model="policy", messages=msgs, extra_body={"script": "done"})
    msgs.append({"role": "assistant", "content": r.choices[0].message.content})
    return Episode(reward=1.0, messages=msgs)


async def compacting(client, prompt):
    """One call, then a new context (compaction): two rows."""
    msgs = list(prompt)
    r = await client.chat.completions.create(model="policy", messages=msgs, extra_body={"script": "first step"})
    a1 = {"role": "assistant", "content": r.choices[0].message.content}
    fresh = [{"role": "user", "content": "summary: one step done"}]
    r = await client.chat.completions.create(model="policy", messages=fresh, extra_body={"script": "done"})
    return Episode(reward=0.0, messages=[*msgs, a1, *fresh, {"role": "assistant", "content": r.choices[0].message.content}])


def main() -> None:
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import rowgrove.integrations.verl_agent_loop  # noqa: F401  (registers "rowgrove")

    url, model_dir = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 512, "response_length": 512}},
                            "data": {}})
    out = {"registered": dict(_agent_loop_registry["rowgrove"])}
    prompt = [{"role": "user", "content": "Count to two."}]
    for name in ("two_calls", "compacting"):
        conf = {**_agent_loop_registry["rowgrove"], "gateway_url": url, "agent": f"verl_agent_side:{name}"}
        loop = hydra.utils.instantiate(config=conf, trainer_config=DictConfigWrap(config=cfg), server_manager=None,
                                       tokenizer=tok, processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
                                       data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
        try:
            res = asyncio.run(loop.run({}, raw_prompt=prompt, uid=f"g-{name}"))
            out[name] = {"prompt_ids": res.prompt_ids, "response_ids": res.response_ids,
                         "response_mask": res.response_mask, "response_logprobs": res.response_logprobs,
                         "reward_score": res.reward_score, "extra_fields": res.extra_fields}
        except Exception as e:  # reported, asserted on by the pytest side
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
