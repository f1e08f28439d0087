"""Recorded rollouts of a compaction agent on the real Qwen3 template, for the AsyncGRPO tests and
the comparison in docs/integrations.md (`trl_async_compare.py`).

A real gateway on loopback (scripted engine over the tiny Qwen3-family model, whose template is
Qwen3's own), the official OpenAI SDK, and an agent whose context policy is rowgrove's
`keep_last_rounds` (rowgrove.agents.compaction). Each rollout:

    call 1  [task]                                   -> <think>..</think> + tool call
    call 2  [task, A1, tool]                         -> <think>..</think> + tool call
            compaction: keep the last round, a note stands for the dropped one (a new context)
    call 3  [task, note, A2, tool]                   -> <think>..</think> + a draft answer
    call 4  [task, note, A2, tool, A3, user "check"] -> <think>..</think> + the final answer

The agent records what a capturing proxy would: each call's request messages (its "trace"). The
gateway's ledger holds what the engine was given and sampled: per call the full prompt ids,
the sampled ids and their logprobs.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from rowgrove.agents.compaction import keep_last_rounds, render_context
from rowgrove.agents.loop import assistant_dict
from rowgrove.integrations.harness import Episode, arollouts_to_rows
from rowgrove.types import Row

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a fact up",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}]
PROMPTS = ["How many apples are in the basket?", "Which city is the capital?"]
NUM_GENERATIONS = 2


def qwen3_reply(content: str = "", call: dict[str, Any] | None = None, reasoning: str | None = None) -> str:
    """What Qwen3 samples after its generation prompt (thinking, a hermes tool call, <|im_end|>)."""
    head = "" if reasoning is None else "<think>\n" + reasoning + "\n</think>\n\n"
    body = content
    if call is not None:
        body += ("\n" if content else "") + '<tool_call>\n{"name": "' + call["name"] + '", "arguments": ' \
            + json.dumps(call["arguments"], ensure_ascii=False) + "}\n</tool_call>"
    return head + body + "<|im_end|>"


@dataclass
class Trace:
    """What a proxy records for one rollout: each call's request messages, in order."""

    requests: list[list[dict[str, Any]]] = field(default_factory=list)


@dataclass
class Recorded:
    rows: list[Row]
    traces: dict[str, Trace]            # rollout id -> its trace
    calls: dict[str, list[Any]]         # rollout id -> its ledger calls (rowgrove.types.Call), by ordinal


def make_agent(traces: list[Trace]):
    """The compaction agent; every second rollout answers longer and gets reward 0 (so a group's
    rollouts differ in length and reward)."""
    n = [0]

    async def agent(client, prompt):
        k = n[0]
        n[0] += 1
        good = k % 2 == 0
        trace = Trace()
        traces.append(trace)

        async def ask(messages, script):
            trace.requests.append(json.loads(json.dumps(messages)))
            r = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS,
                                                     extra_body={"script": script})
            return assistant_dict(r.choices[0].message)

        head = [{"role": "user", "content": prompt}]
        rounds: list[list[dict[str, Any]]] = []
        accepted: list[dict[str, Any]] = list(head)
        for i, q in enumerate(["basket size", "apples per row"]):
            ctx = render_context(head, rounds, 0)
            a = await ask(ctx, qwen3_reply(call={"name": "lookup", "arguments": {"q": q}},
                                           reasoning=f"I need the {q} first, step {i + 1}."))
            tool = {"role": "tool", "tool_call_id": a["tool_calls"][0]["id"], "content": f"{q}: {3 + i}"}
            rounds.append([a, tool])
            accepted += [a, tool]
        rounds, omitted = keep_last_rounds(rounds, 1)
        ctx = render_context(head, rounds, omitted)
        draft = "There are 12 apples." if good else "There are probably twelve apples, give or take a few."
        a3 = await ask(ctx, qwen3_reply(draft, reasoning="Multiply the two numbers I found."))
        ctx = [*ctx, a3, {"role": "user", "content": "Check your answer once more."}]
        a4 = await ask(ctx, qwen3_reply("Checked: 12." if good else "Checked: about twelve.",
                                        reasoning="3 rows of 4 is 12, the draft holds."))
        return Episode(reward=float(good), messages=[*accepted, a3, ctx[-1], a4])

    return agent


def record(gateway: Any, prompts: list[str] = PROMPTS, num_generations: int = NUM_GENERATIONS) -> Recorded:
    """Run the agent `num_generations` times per prompt through `gateway` (a GatewayHandle) and
    return the rows, the traces and the ledger's calls."""
    traces: list[Trace] = []
    entries = [p for p in prompts for _ in range(num_generations)]
    groups = [f"g{i // num_generations}" for i in range(len(entries))]
    rows = asyncio.run(arollouts_to_rows(gateway.url, entries, make_agent(traces), group_ids=groups, concurrency=1))
    rollout_ids = list(dict.fromkeys(r.rollout_id for r in rows))
    calls = {rid: sorted(gateway.ledger.calls(rid), key=lambda c: c.ordinal) for rid in rollout_ids}
    return Recorded(rows, dict(zip(rollout_ids, traces, strict=True)), calls)
