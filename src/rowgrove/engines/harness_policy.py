"""A scripted reply policy that reads the prompt, for driving real coding agents in tests and demos.

`reply(prompt_text)` picks the scripted engine's reply text from the decoded prompt, deterministically:

- a title request (opencode's, Claude Code's) -> a short title;
- a compaction / summary request (Codex's "CONTEXT CHECKPOINT COMPACTION", Claude Code's /compact,
  Qwen Code's chat compression, whose last user turn asks to "generate the <state_snapshot>",
  opencode's compaction) -> a plain summary;
- mini-swe-agent's prompt: with its `bash` tool (2.x) the shell call, then a call of its submit
  command; without tools (text mode) a ```bash block, then its submit command;
- otherwise, while fewer than `TOOL_TURNS` tool results follow the last user turn: a hermes
  `<tool_call>` (the Qwen3-style tiny model's native format) to the harness's own shell tool, found
  among the rendered `<tools>`; with a sub-agent tool (Claude Code's `Agent`, Codex's `spawn_agent`)
  and a task that asks for one, that tool once first (Codex's then `wait_agent` on the id it returns);
- then a final answer.

The shell command writes `answer.txt` in the working folder (what the tests' reward checks).
Selected with `rowgrove serve --engine scripted --script harness`.
"""

from __future__ import annotations

import json
import re

TOOL_TURNS = 1
SHELL_TOOLS = ("exec_command", "shell", "Bash", "run_shell_command", "bash")
SUBAGENT_TOOLS = ("Agent", "Task", "spawn_agent")
COMMAND = "echo done > answer.txt && cat answer.txt"
SUMMARY = ("Summary: the task was to write answer.txt; the shell command `echo done > answer.txt` ran "
           "and the file holds `done`. Nothing else is left to do.")
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"

_TOOL_NAME = re.compile(r'"name"\s*:\s*"([A-Za-z0-9_.\-]+)"')


def _last_user(prompt: str) -> tuple[str, str]:
    """(text of the last user turn that is not a tool result, what follows it) in a ChatML prompt
    (the Qwen3 template renders tool results as user turns holding <tool_response>)."""
    at = len(prompt)
    while True:
        at = prompt.rfind("<|im_start|>user", 0, at)
        if at < 0:
            return prompt, ""
        if not prompt.startswith("<|im_start|>user\n<tool_response>", at):
            break
    rest = prompt[at:]
    end = rest.find("<|im_end|>")
    return (rest if end < 0 else rest[:end]), ("" if end < 0 else rest[end:])


def _tools(prompt: str) -> list[str]:
    start = prompt.find("<tools>\n")  # the block itself, not the instructions' mention of the tags
    end = prompt.find("</tools>", start + 1)
    if start < 0 or end < 0:
        return []
    names = []
    for line in prompt[start + 7:end].splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            m = _TOOL_NAME.search(line)
            if m:
                names.append(m.group(1))
            continue
        fn = obj.get("function", obj) if isinstance(obj, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def _args(tool: str, command: str) -> dict:
    if tool == "exec_command":
        return {"cmd": command}
    if tool == "shell":
        return {"command": ["bash", "-lc", command]}
    if tool in ("Bash", "bash"):
        return {"command": command, "description": "write the answer file"}
    if tool == "run_shell_command":
        return {"command": command, "description": "write the answer file"}
    return {"command": command}


def tool_call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def reply(prompt: str) -> str:
    user, after = _last_user(prompt)
    low = user.lower()
    if "title" in low and ("generate" in low or "short" in low) and len(user) < 6000 and "<tools>" not in prompt:
        return "Answer file task"
    task = low.split("</system-reminder>")[-1]  # Claude Code's reminders are not the request
    if ("context checkpoint compaction" in task or "/compact" in task or "<state_snapshot>" in task
            or "summar" in task and ("conversation" in task or "compact" in task)):
        return SUMMARY
    tools = _tools(prompt)
    if SUMMARY in prompt:  # a compacted context: the work is done, answer (a new tool call would grow it again)
        return "Done: answer.txt holds `done`."
    results = after.count("<tool_response>")
    if not tools:  # mini-swe-agent: a fenced bash block, then its submit command
        if "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in prompt:
            done = prompt.count("<returncode>") + prompt.count("returncode")
            command = MINI_SUBMIT if done else COMMAND
            return f"THOUGHT: {'submit' if done else 'write the answer file'}.\n\n```bash\n{command}\n```"
        return "Done: answer.txt holds `done`."
    if results < TOOL_TURNS:
        sub = next((t for t in tools if t.split(".")[-1] in SUBAGENT_TOOLS), None)
        if sub and "sub-agent" in low and results == 0 and "subagent_spawned" not in prompt:
            if sub.endswith("spawn_agent"):
                return tool_call(sub, {"message": "write answer.txt with the word done"})
            return tool_call(sub, {"description": "write the answer", "prompt": "write answer.txt with the word done",
                                   "subagent_type": "general-purpose"})
        shell = next((t for t in tools if t in SHELL_TOOLS), None)
        if shell:
            return tool_call(shell, _args(shell, COMMAND))
    spawned = re.search(r'"agent_id"\s*:\s*"([^"]+)"', after)
    wait = next((t for t in tools if t.split(".")[-1] == "wait_agent"), None)
    if spawned and wait and '"wait_agent"' not in after and wait not in after:
        # Codex's spawn_agent returns at once: wait for the sub-agent, or exec ends and stops it
        return tool_call(wait, {"targets": [spawned.group(1)], "timeout_ms": 30000})
    shell = next((t for t in tools if t in SHELL_TOOLS), None)
    if shell and "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in prompt and MINI_SUBMIT not in after:
        # mini-swe-agent 2.x: it works through its bash tool and ends only on its submit command
        return tool_call(shell, _args(shell, MINI_SUBMIT))
    return "Done: answer.txt holds `done`."
