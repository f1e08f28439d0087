"""TRL's GRPOTrainer on rows from a rowgrove gateway: an agent that compacts its context, so each
rollout is two rows, trained with rowgrove's split-invariant loss inside TRL's own loss code, and
the gateway's engine kept on the trainer's weights after every step (`gateway_url`), each sync
verified against the trainer's own logprobs.

    pip install 'rowgrove[trl]'
    python examples/integrations/trl_gateway.py
"""

import collections

from datasets import Dataset
from trl import GRPOConfig

from rowgrove.gateway.testing import start_gateway
from rowgrove.integrations.harness import Episode, rollouts_to_rows
from rowgrove.integrations.trl import RowgroveGRPOTrainer
from rowgrove.model.load import load_model


seen = collections.Counter()


async def agent(client, prompt):
    """Two turns, then a compacted context and a last turn. Reward: did it say "yes"? (The scripted
    engine says "yes" on every other rollout of a prompt, so the rollouts of one prompt differ.)"""
    seen[prompt] += 1
    says_yes = seen[prompt] % 2 == 1

    async def ask(messages, script):  # `script`: what the scripted test engine replies
        r = await client.chat.completions.create(model="policy", messages=messages, extra_body={"script": script})
        return {"role": "assistant", "content": r.choices[0].message.content}

    msgs = [{"role": "user", "content": prompt}]
    msgs.append(await ask(msgs, "thinking"))
    msgs.append({"role": "user", "content": "go on"})
    msgs.append(await ask(msgs, "almost"))
    fresh = [{"role": "user", "content": prompt + " (summary: two turns so far)"}]
    last = await ask(fresh, "yes" if says_yes else "no")
    return Episode(reward=float("yes" in last["content"]), messages=[*msgs, *fresh, last])


def main() -> None:
    model, tokenizer = load_model("tiny")  # any causal LM and its tokenizer; the gateway serves the same model
    # the scripted engine replies from a script but reports its model's real logprobs, and loads weights
    with start_gateway("tiny", engine="scripted") as gw:
        args = GRPOConfig(output_dir="/tmp/rowgrove-trl-example", loss_type="dapo", beta=0.0, num_generations=2,
                          per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=2,
                          learning_rate=1e-4, report_to="none", save_strategy="no", use_cpu=True, logging_steps=1)
        trainer = RowgroveGRPOTrainer(
            model, args=args, processing_class=tokenizer, loss_mode="token-mean",
            train_dataset=Dataset.from_dict({"prompt": ["Count the apples.", "Name a city!"]}),
            rows_fn=lambda prompts, trainer: rollouts_to_rows(gw.url, prompts, agent),
            gateway_url=gw.url,  # sync the gateway's engine after every optimizer step, verified
        )
        trainer.train()
    rows = trainer.last_rows
    grad_norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    print(f"trained 2 steps; last step: {len({r.rollout_id for r in rows})} rollouts, {len(rows)} rows; "
          f"gradient norms {grad_norms}")
    print(f"verified syncs: {len(trainer.syncs)}; largest engine - trainer logprob gap "
          f"{max(rec.gap for _, rec in trainer.syncs):.1e}")


if __name__ == "__main__":
    main()
