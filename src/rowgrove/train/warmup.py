"""Supervised warm-up: a random tiny model emits no tool calls, so before GRPO it is fine-tuned on
synthetic transcripts of the task (rowgrove.envs.synth_transcripts), rendered through the chat
template with the task's tools, with loss only on the assistant turns (their body and the
end-of-turn token the model must sample to stop). Seconds on the CPU.

Rendering is piecewise, like the gateway does it: context segments (mask 0) and assistant
segments (mask 1) are tokenized separately and concatenated, so the token boundaries the model
learns are the ones it will see at generation time (prompt ids, then its own sampled ids).

The warmed model is cached by a hash of everything that determines it (`warm_model_dir`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rowgrove.errors import InputError
from rowgrove.types import Row


def transcript_row(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]],
                   name: str = "sft") -> Row:
    """One SFT row: the conversation rendered with the chat template, loss mask 1 exactly on the
    tokens of each assistant turn (after its generation prompt, through its end-of-turn token).
    Transcripts should end with a non-assistant message or an assistant turn (tail text after the
    last assistant turn is dropped: nothing is learned there)."""
    from rowgrove.model.load import end_of_turn_id

    eot = tokenizer.convert_ids_to_tokens(end_of_turn_id(tokenizer))

    def render(msgs: Sequence[dict[str, Any]], gen: bool) -> str:
        return tokenizer.apply_chat_template(list(msgs), tools=list(tools) or None, tokenize=False,
                                             add_generation_prompt=gen)

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    ids: list[int] = []
    mask: list[int] = []
    done = ""  # text already turned into ids
    for j, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        prompt = render(messages[:j], True)
        full = render(messages[: j + 1], False)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            raise InputError(f"chat template of {name} is not prefix-stable at assistant turn {j}: "
                             "warm-up needs a template whose renderings extend each other")
        end = full.find(eot, len(prompt))
        if end < 0:
            raise InputError(f"assistant turn {j} of {name} renders without the end-of-turn token {eot!r}")
        ctx, body = enc(prompt[len(done):]), enc(full[len(prompt): end + len(eot)])
        ids += ctx + body
        mask += [0] * len(ctx) + [1] * len(body)
        done = full[: end + len(eot)]
    if not any(mask):
        raise InputError(f"transcript {name} has no assistant turn to learn from")
    return Row(rollout_id=name, group_id=None, input_ids=ids, loss_mask=mask, reward=0.0, advantage=0.0,
               logprobs=[0.0] * len(ids))


def sft_loss(model: Any, rows: Sequence[Row], capacity: int = 4096) -> torch.Tensor:
    """Mean cross-entropy over the mask-1 tokens of `rows` (packed micro-batches; backward is
    called on each micro-batch's share, divisor = all mask-1 tokens). Returns the loss value."""
    from rowgrove.algo import loss_weights
    from rowgrove.train.update import build_microbatches, microbatch_logits

    device = next(model.parameters()).device
    weights = loss_weights(rows, "token-mean")
    total = torch.zeros((), device=device)
    for mb in build_microbatches(rows, weights, capacity=capacity, packed=True, device=device):
        logits = microbatch_logits(model, mb)
        keep = mb.trained.any(dim=0).nonzero().squeeze(-1)
        sel = mb.trained[:, keep]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, mb.target[:, keep][sel][:, None]).squeeze(-1)
        loss = -(mb.weight[:, keep][sel] * logp).sum()
        loss.backward()
        total = total + loss.detach()
    return total


class _ScriptedClient:
    """An AsyncOpenAI stand-in whose answers come from an env's scripted policy; it records the
    context of every call, so the warm-up sees exactly the contexts the agent sends (compaction
    included)."""

    def __init__(self, env: Any, policy: str, rng: Any, expert_prob: float = 0.5):
        from types import SimpleNamespace

        self.env, self.policy, self.rng, self.expert_prob = env, policy, rng, expert_prob
        self.calls: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    async def _create(self, *, messages: list[dict[str, Any]], **kw: Any) -> Any:
        from types import SimpleNamespace

        from rowgrove.envs import tool_call_message

        expert = self.policy == "expert" or (self.policy == "noisy" and self.rng.random() < self.expert_prob)
        name, args = self.env.expert_action() if expert else self.env.random_action(self.rng)
        msg = tool_call_message(name, args, f"call_{len(self.calls)}")
        self.calls.append(([dict(m) for m in messages], msg))
        return SimpleNamespace(choices=[SimpleNamespace(message=msg)])


def agent_transcripts(env_name: str, n: int, seed: int, policy: str, agent_config: Any) -> list[list[dict[str, Any]]]:
    """Conversations for the warm-up: `n` episodes of the reference agent (with its compaction
    policy) answered by a scripted policy, cut like the gateway cuts them: a call whose context
    extends the previous context and answer continues the same conversation, any other starts a
    new one. Every conversation ends with an assistant turn."""
    import asyncio
    import random

    from rowgrove.agents import run_episode
    from rowgrove.envs import make_env, make_tasks

    rng = random.Random(seed)
    out: list[list[dict[str, Any]]] = []
    for task in make_tasks(env_name, n, seed):
        env = make_env(env_name, seed)
        client = _ScriptedClient(env, policy, rng)
        asyncio.run(run_episode(client, env, task, agent_config))
        conv: list[dict[str, Any]] = []
        for context, answer in client.calls:
            if not (conv and context[: len(conv)] == conv):
                if conv:
                    out.append(conv)
            conv = context + [answer]
        if conv:
            out.append(conv)
    return out


def warm_up(model: Any, tokenizer: Any, env: str, *, steps: int, batch: int, lr: float, seed: int,
            policy: str = "random", agent_config: Any = None) -> list[float]:
    """Fine-tune `model` in place for `steps` AdamW steps of `batch` conversations of `env`
    (`agent_transcripts` with `agent_config`, default AgentConfig()); returns each step's loss."""
    from rowgrove.agents import AgentConfig
    from rowgrove.envs import make_env

    tools = make_env(env, seed).tools
    n = min(steps * batch, 512)
    convs = agent_transcripts(env, n, seed + 7919, policy, agent_config or AgentConfig())
    rows = [transcript_row(tokenizer, t, tools, f"sft-{i}") for i, t in enumerate(convs)]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    losses = []
    model.train()
    for _ in range(steps):
        pick = rng.choice(len(rows), size=min(batch, len(rows)), replace=False)
        opt.zero_grad(set_to_none=True)
        losses.append(float(sft_loss(model, [rows[i] for i in pick])))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    model.set_attn_implementation("sdpa")  # generation needs the standard attention back
    return losses


def warm_model_dir(key: str) -> Path:
    """Where the warmed model of `key` (a config hash) is cached, next to the base model cache."""
    from rowgrove.model.tiny import cache_root

    return cache_root() / f"warm-{key}"


def save_model_dir(model: Any, tokenizer: Any, out: Path) -> Path:
    """save_pretrained model + tokenizer into `out` atomically (temp sibling, then rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "rowgrove-warm.done").write_text("ok\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
