"""Sub-agents in one rollout: a Claude Code-shaped main conversation and the sub-agent its Agent
tool starts (another system prompt, the same rollout base URL and key), and a Codex-shaped main
conversation and the sub-agent its `multi_agent_v1.spawn_agent` call starts, their calls
interleaved. Each conversation lands as its own root (tree) of the rollout, and a finish with no
record (`{"conversations": []}`, what a harness that keeps none sends) gives one row per
conversation, under the rollout's one reward."""

from __future__ import annotations

import sys
from pathlib import Path

import anthropic
import httpx
from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixtures_http import assert_continuation  # noqa: E402
from test_claude_code_shapes import EXTRA as CC_EXTRA  # noqa: E402
from test_claude_code_shapes import SYSTEM as CC_SYSTEM  # noqa: E402
from test_claude_code_shapes import TOOLS as CC_TOOLS  # noqa: E402
from test_codex_shapes import EXTRA as CODEX_EXTRA  # noqa: E402
from test_codex_shapes import INPUT as CODEX_INPUT  # noqa: E402
from test_codex_shapes import TOOLS as CODEX_TOOLS  # noqa: E402

from rowgrove.gateway.testing import start_gateway  # noqa: E402
from rowgrove.toolcalls import format_assistant_text  # noqa: E402

SUB_SYSTEM = [{"type": "text", "text": "You are Claude Code."},
              {"type": "text", "text": "SYS-SUB you are a sub-agent: search the code and report"}]
CODEX_SUB = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "DEV-SUB you are agent-1"}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look at tests/"}]},
]


def _blocks(message) -> list[dict]:
    return [b.model_dump(exclude_none=True) for b in message.content]


def test_sub_agents_are_roots_of_their_own_and_rows_of_their_own():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        ant = anthropic.Anthropic(base_url=ro["base_url"].removesuffix("/v1"), api_key=ro["api_key"],
                                  max_retries=0, default_headers={"anthropic-beta": "claude-code-20250219"})
        oai = OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)

        def claude(system, messages, script):
            return ant.messages.create(model="m", max_tokens=256, system=system, messages=messages, tools=CC_TOOLS,
                                       extra_body={**CC_EXTRA, "script": script})

        def codex(items, script):
            return oai.responses.create(model="m", input=items, tools=CODEX_TOOLS, **CODEX_EXTRA,
                                        extra_body={"script": script})

        # Claude Code: the main agent starts a sub-agent with its Agent tool
        main = [{"role": "user", "content": "fix the failing test"}]
        m1 = claude(CC_SYSTEM, main, format_assistant_text(tool_calls=[("Agent", {"prompt": "find the test"})]))
        agent_use = next(b for b in m1.content if b.type == "tool_use")
        sub = [{"role": "user", "content": "find the test"}]
        s1 = claude(SUB_SYSTEM, sub, format_assistant_text(tool_calls=[("Bash", {"command": "ls tests"})]))
        # Codex: the main agent spawns agent-1 (interleaved with the Claude Code calls)
        x1 = codex(CODEX_INPUT, format_assistant_text(tool_calls=[("spawn_agent", {"message": "look at tests/"})]))
        spawn = next(o for o in x1.output if o.type == "function_call").model_dump(exclude_none=True)
        assert spawn["namespace"] == "multi_agent_v1"
        bash_use = next(b for b in s1.content if b.type == "tool_use")
        sub += [{"role": "assistant", "content": _blocks(s1)},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": bash_use.id,
                                              "content": "test_a.py"}]}]
        s2 = claude(SUB_SYSTEM, sub, "the test is tests/test_a.py")
        y1 = codex(CODEX_SUB, "agent-1: tests/ holds test_a.py")
        main += [{"role": "assistant", "content": _blocks(m1)},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": agent_use.id,
                                               "content": s2.content[0].text}]}]
        m2 = claude(CC_SYSTEM, main, "fixed")
        items = CODEX_INPUT + [{k: spawn[k] for k in ("type", "call_id", "name", "arguments", "namespace")},
                               {"type": "function_call_output", "call_id": spawn["call_id"],
                                "output": y1.output_text}]
        x2 = codex(items, "done")
        assert m2.content[0].text == "fixed" and x2.output_text == "done"

        calls = {c.ordinal: c for c in gw.ledger.calls(ro["rollout_id"])}
        # ordinals: 1 m1, 2 s1, 3 x1, 4 s2, 5 y1, 6 m2, 7 x2
        assert [o for o, c in calls.items() if c.root] == [1, 2, 3, 5]
        for child, parent in ((4, 2), (6, 1), (7, 3)):
            assert_continuation(gw.ledger, calls[child], calls[parent])

        done = httpx.post(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/finish",
                          json={"conversations": [], "reward": 1.0})
        assert done.status_code == 200, done.text
        out = httpx.get(f"{gw.url}/v1/rollouts/{ro['rollout_id']}/rows").json()
        assert out["invalid_reason"] is None, out
        chains = sorted(tuple(r["call_ids"]) for r in out["rows"])
        ids = {o: c.id for o, c in calls.items()}
        assert chains == sorted([(ids[1], ids[6]), (ids[2], ids[4]), (ids[3], ids[7]), (ids[5],)])
        assert {r["reward"] for r in out["rows"]} == {1.0}
