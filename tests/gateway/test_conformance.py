"""The conformance matrix: every model family of tests/families.py x every episode a harness runs,
through a real gateway on loopback, with the official `openai` SDK as client.

Each family gets one gateway (the scripted engine on the family's tiny model folder, built around
the family's REAL chat template, on its real vocabulary where it has one: tests/families.py
`suite_model_dir`). Each reply is scripted in the family's native sampled format
(`Family.native`, stop token included) and echoed back exactly as the SDK returned it, either
`message.model_dump(exclude_none=True)` or the raw `message.model_dump()` with its nulls.

Scenarios (`SCENARIOS`):
- tool_loop / tool_loop_raw: user -> tool call -> tool result -> a second tool call -> tool
  result -> answer (the raw variant echoes `model_dump()` with nulls);
- second_user: user -> answer -> user -> answer -> user -> answer (no tools);
- compaction: a tool round and an answer, then the harness drops the old turns and sends a summary
  with the last answer and a new question (a new root, reason REWRITTEN), then one more turn;
- thinking (families that think): reasoning + tool call (or reasoning + answer where the family
  thinks only without tools) -> tool result -> reasoning + answer -> user -> reasoning + answer;
- developer / developer_after_system / developer_responses: a harness's instructions as developer
  messages (Codex sends two developer items and no `instructions`): [developer, developer, user]
  (Chat Completions, the second a list of text parts), [system, developer, user] (Chat
  Completions), [developer, developer, user] as Responses input items; then answer -> user ->
  answer. Each family's template sees the mapped
  conversation: the leading run of system / developer messages as one message (texts joined by a
  blank line), `developer` where the run holds one and the template renders that role, else
  `system` (`mapped_messages`, written here from that rule, to check the gateway).

For each cell and each call the checks are (`Cell`):
- accepted: HTTP 200, the reply parsed as scripted (tool_calls where the model called a tool,
  reasoning_content where it thought, the content);
- continuation or root as expected (`continued` / `expected_continuations`), with the reason
  recorded by the gateway's decision (REWRITTEN for the compacted request);
- token-exact: the engine's full prompt (the ledger's; also what the engine was asked and
  usage.prompt_tokens) equals the model folder's tokenizer's tokenization of
  `apply_chat_template(engine_messages(mapped_messages(messages)), tools, add_generation_prompt=True)`; for a call
  marked history_drift, its prefix is the parent's exact context (prompt + sampled ids) and the
  rest is the tokenization of what the template writes after the parent's turn (the boundary found
  independently of the gateway: the last turn-end marker of the family before the first new
  message's text); a call is marked drift exactly when the rendering does not start with the
  parent's context text;
- instructions in prompt (the developer cells): every system / developer message's text is in the
  template's rendering of the mapped conversation and in the engine's prompt (a template that
  drops or refuses the role would lose it). Not checked elsewhere: Mistral Nemo's template writes
  the system message only before a last user message, so a tool loop's later prompts lack it;
- correct fallback: every continuation's parent is the call that produced the request's last
  assistant message, every expected root is a root with the expected reason;
- rows: the finished rollout's rows are valid, the loss-masked tokens of each row are exactly the
  sampled ids of the calls it is the first to train, and every call is trained once.

`test_docs_table` builds the whole matrix and compares its markdown table with the one in
docs/families.md; `python tests/gateway/test_conformance.py --write-docs` rewrites that table.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from families import FAMILIES, require_families, Family, family, suite_model_dir  # noqa: E402
from fixtures_http import TestEngine, full_prompt  # noqa: E402

import rowgrove.gateway.sessions as gw_sessions  # noqa: E402
from rowgrove.gateway.core import decide as gw_decide  # noqa: E402
from rowgrove.gateway.core.preprocess import engine_messages  # noqa: E402

require_families(module=True)

DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"
TABLE_BEGIN = "<!-- conformance-table: begin (python tests/gateway/test_conformance.py --write-docs) -->"
TABLE_END = "<!-- conformance-table: end -->"

NAMES = list(FAMILIES)
SCENARIOS = ("tool_loop", "tool_loop_raw", "second_user", "compaction", "thinking",
             "developer", "developer_after_system", "developer_responses")
DEVELOPER = ("developer", "developer_after_system", "developer_responses")
LABELS = {"tool_loop": "tool loop", "tool_loop_raw": "raw tool loop", "second_user": "second user turn",
          "compaction": "compaction", "thinking": "thinking", "developer": "developer",
          "developer_after_system": "developer after system", "developer_responses": "developer (Responses)"}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
SYSTEM = "You are a helpful assistant. Answer briefly."

# What ends an assistant turn in each family's rendering of history (the gateway finds its own
# markers from the template; these are written down from the templates, to check it).
TURN_END = {
    "qwen2.5": ("<|im_end|>",), "qwen3": ("<|im_end|>",),
    "llama3.1": ("<|eot_id|>", "<|eom_id|>"),
    "mistral-nemo": ("</s>",),
    "deepseek-v3.1": ("<｜end▁of▁sentence｜>",),
    "gpt-oss": ("<|end|>", "<|call|>", "<|return|>"),
    "glm-4.6": ("<|user|>", "<|observation|>"),
}

# Cells that fail because of a gateway bug: {(family, scenario): reason} -> xfail(strict=True).
# Empty: every cell passes. A new failure goes here with its reproduction until it is fixed.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


# -- one episode -----------------------------------------------------------------------------------


@dataclass
class Step:
    """One request of an episode, what was expected of it and what came back."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    kwargs: dict[str, Any]
    script: str
    want_content: str | None
    want_calls: list[tuple[str, dict[str, Any]]]
    want_reasoning: str | None
    want_continue: bool
    want_reason: str | None = None          # the root reason expected (None: any, or a continuation)
    parent_msg: int | None = None           # index in messages of the last assistant message
    response: Any = None
    reason: str | None = None               # the gateway decision's reason
    error: str | None = None
    engine_prompt: list[int] | None = None
    call_id: str | None = None
    api: str = "chat"                       # "chat" (Chat Completions) or "responses"


@dataclass
class Cell:
    """What one family x scenario did."""

    family: str
    scenario: str
    applicable: bool = True
    calls: int = 0
    accepted: bool = True
    expected_continuations: int = 0
    continued: int = 0
    token_exact: bool = True
    drift: int = 0
    fallback_ok: bool = True
    rows_ok: bool = True
    tool_results_ok: bool = True            # each tool result's text is in the prompt as sent
    instructions_ok: bool = True            # each system / developer text is in the prompt
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # differences that are not failures

    @property
    def ok(self) -> bool:
        return (not self.applicable) or (self.accepted and self.token_exact and self.fallback_ok and self.rows_ok
                                         and self.tool_results_ok and self.instructions_ok
                                         and self.continued == self.expected_continuations)

    def fail(self, what: str) -> None:
        self.problems.append(what)


class _DecisionSpy:
    """Records the reason of every decision the gateway makes (the server runs in this process)."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self._orig = gw_sessions.decide

    def __call__(self, *a: Any, **kw: Any) -> gw_decide.Decision:
        d = self._orig(*a, **kw)
        self.reasons.append(d.reason)
        return d

    def install(self) -> None:
        gw_sessions.decide = self

    def remove(self) -> None:
        gw_sessions.decide = self._orig


class Matrix:
    """One gateway per family (launched on first use), the cells computed so far, and the spy."""

    def __init__(self) -> None:
        self.gateways: dict[str, Any] = {}
        self.cells: dict[tuple[str, str], Cell] = {}
        self.spy = _DecisionSpy()
        self.spy.install()

    def gateway(self, name: str):
        gw = self.gateways.get(name)
        if gw is None:
            import torch

            from rowgrove.engines import make_engine
            from rowgrove.gateway.testing import launch_gateway

            torch.set_num_threads(1)
            engine = TestEngine(make_engine("scripted", str(suite_model_dir(name))))
            gw = launch_gateway(str(suite_model_dir(name)), engine=engine)
            gw.test_engine = engine
            self.gateways[name] = gw
        return gw

    def close(self) -> None:
        for gw in self.gateways.values():
            gw.close()
            import asyncio

            asyncio.run(gw.test_engine.inner.aclose())
        self.gateways.clear()
        self.spy.remove()

    def cell(self, name: str, scenario: str) -> Cell:
        key = (name, scenario)
        if key not in self.cells:
            t0 = time.perf_counter()
            self.cells[key] = run_cell(self.gateway(name), family(name), scenario, self.spy)
            self.cells[key].seconds = time.perf_counter() - t0
        return self.cells[key]

    def all_cells(self) -> list[Cell]:
        return [self.cell(n, s) for n in NAMES for s in SCENARIOS]


class Episode:
    """A harness on one rollout: asks, echoes replies back, finishes."""

    def __init__(self, gw: Any, fam: Family, spy: _DecisionSpy, *, raw: bool = False, thinking: bool = False):
        from openai import OpenAI

        self.gw, self.fam, self.spy, self.raw = gw, fam, spy, raw
        self.kwargs = fam.prompt_kwargs(thinking)
        self.ro = gw.create_rollout(f"conformance-{fam.name}")
        self.client = OpenAI(base_url=self.ro["base_url"], api_key=self.ro["api_key"], max_retries=0)
        self.steps: list[Step] = []
        self.sources: dict[int, str] = {}  # id() of an echoed message -> the call that produced it

    def echo(self, message: Any) -> dict[str, Any]:
        return message.model_dump() if self.raw else message.model_dump(exclude_none=True)

    def ask(self, messages: list[dict[str, Any]], *, content: str | None = None,
            calls: Sequence[tuple[str, dict[str, Any]]] = (), reasoning: str | None = None,
            tools: list[dict[str, Any]] | None = None, want_continue: bool = True,
            want_reason: str | None = None, api: str = "chat") -> dict[str, Any] | None:
        """One call; returns the echoed assistant message (None when the call failed)."""
        script = self.fam.native(content, list(calls), reasoning)
        j = max((k for k, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        step = Step(list(messages), tools, dict(self.kwargs), script, content, list(calls), reasoning,
                    want_continue, want_reason, j, api=api)
        self.steps.append(step)
        n_prompts = len(self.gw.test_engine.prompts)
        n_reasons = len(self.spy.reasons)
        extra: dict[str, Any] = {"script": script}
        if self.kwargs:
            extra["chat_template_kwargs"] = self.kwargs
        try:
            if api == "responses":
                r = self.client.responses.create(model="conformance", input=_response_items(messages),
                                                 extra_body=extra, max_output_tokens=512)
            else:
                r = self.client.chat.completions.create(model="conformance", messages=messages, tools=tools or
                                                        _omit(), extra_body=extra, max_tokens=512)
        except Exception as e:  # recorded, not raised: the cell says what failed
            step.error = f"{type(e).__name__}: {e}"
            return None
        step.response = r
        step.call_id = r.id.removeprefix("resp_") if api == "responses" else r.id
        step.reason = self.spy.reasons[-1] if len(self.spy.reasons) > n_reasons else None
        prompts = self.gw.test_engine.prompts
        step.engine_prompt = prompts[-1] if len(prompts) > n_prompts else None
        if api == "responses":  # the harness keeps the output item; its chat form is the message
            msg: dict[str, Any] = {"role": "assistant", "content": r.output_text}
        else:
            msg = self.echo(r.choices[0].message)
        self.sources[id(msg)] = step.call_id
        return msg


def _response_items(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages (text only) as the Responses input items a harness such as Codex sends."""
    out = []
    for m in messages:
        kind = "output_text" if m["role"] == "assistant" else "input_text"
        out.append({"type": "message", "role": m["role"], "content": [{"type": kind, "text": m["content"]}]})
    return out


def _text(content: str | Sequence[Mapping[str, Any]]) -> str:
    """A message's text: the string, or its text parts joined by a newline."""
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)


def mapped_messages(messages: Sequence[Mapping[str, Any]], renders_developer: bool) -> list[dict[str, Any]]:
    """The conversation as the family's template should see it: a leading run of several system /
    developer messages as one (texts joined by a blank line, role developer when the run holds
    one), and a developer message as a system message where the template does not name the role."""
    out = [dict(m) for m in messages]
    n = 0
    while n < len(out) and out[n].get("role") in ("system", "developer"):
        n += 1
    if n > 1:
        role = "developer" if any(m["role"] == "developer" for m in out[:n]) else "system"
        out = [{"role": role, "content": "\n\n".join(_text(m["content"]) for m in out[:n])}] + out[n:]
    for m in out:
        if m.get("role") == "developer" and not renders_developer:
            m["role"] = "system"
    return out


def _omit() -> Any:
    from openai import NOT_GIVEN

    return NOT_GIVEN


def _start(question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _tool_msg(msg: Mapping[str, Any], k: int, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": msg["tool_calls"][k]["id"], "content": text}


# -- the scenarios -----------------------------------------------------------------------------------


def _ep_tool_loop(ep: Episode) -> list[list[dict]]:
    msgs = _start("What is the weather in Paris?")
    a1 = ep.ask(msgs, calls=[("get_weather", {"city": "Paris"})], tools=TOOLS, want_continue=False)
    if a1 is None:
        return [msgs]
    msgs += [a1, _tool_msg(a1, 0, "Paris: 21 degrees, sunny")]
    a2 = ep.ask(msgs, calls=[("get_weather", {"city": "Rome"})], tools=TOOLS)
    if a2 is None:
        return [msgs]
    msgs += [a2, _tool_msg(a2, 0, "Rome: 25 degrees, cloudy")]
    a3 = ep.ask(msgs, content="Paris has 21 degrees and sun; Rome is warmer at 25.", tools=TOOLS)
    if a3 is not None:
        msgs.append(a3)
    return [msgs]


def _ep_second_user(ep: Episode) -> list[list[dict]]:
    msgs = _start("Name a prime number.")
    for k, (answer, follow) in enumerate((("Seven is prime.", "And an even one?"),
                                          ("Two is the only even prime.", "Which is larger?"),
                                          ("Seven is larger than two.", None))):
        a = ep.ask(msgs, content=answer, want_continue=k > 0)
        if a is None:
            return [msgs]
        msgs.append(a)
        if follow is not None:
            msgs.append({"role": "user", "content": follow})
    return [msgs]


def _ep_compaction(ep: Episode) -> list[list[dict]]:
    msgs = _start("What is the weather in Oslo?")
    a1 = ep.ask(msgs, calls=[("get_weather", {"city": "Oslo"})], tools=TOOLS, want_continue=False)
    if a1 is None:
        return [msgs]
    msgs += [a1, _tool_msg(a1, 0, "Oslo: 3 degrees, snow")]
    a2 = ep.ask(msgs, content="Oslo is cold: 3 degrees with snow.", tools=TOOLS)
    if a2 is None:
        return [msgs]
    msgs.append(a2)
    # the harness compacts: old turns dropped, a summary instead, the last answer kept
    compact: list[dict] = [{"role": "system", "content": SYSTEM},
                           {"role": "user", "content": "Summary so far: the user asked about Oslo's weather; "
                                                       "the tool said 3 degrees and snow."},
                           a2, {"role": "user", "content": "Should I take a coat?"}]
    a3 = ep.ask(compact, content="Yes, take a warm coat.", tools=TOOLS, want_continue=False,
                want_reason=gw_decide.REWRITTEN)
    if a3 is None:
        return [msgs, compact]
    compact += [a3, {"role": "user", "content": "And gloves?"}]
    a4 = ep.ask(compact, content="Gloves too.", tools=TOOLS)
    if a4 is not None:
        compact.append(a4)
    return [msgs, compact]


def _ep_thinking(ep: Episode) -> list[list[dict]]:
    fam = ep.fam
    msgs = _start("What is the weather in Lima?")
    if fam.reasoning_with_tool_calls:
        a1 = ep.ask(msgs, calls=[("get_weather", {"city": "Lima"})], reasoning="The user wants Lima; call the tool.",
                    tools=TOOLS, want_continue=False)
        if a1 is None:
            return [msgs]
        msgs += [a1, _tool_msg(a1, 0, "Lima: 18 degrees, fog")]
        a2 = ep.ask(msgs, content="Lima: 18 degrees and foggy.", reasoning="The tool answered; report it.", tools=TOOLS)
    else:  # thinks only without tools (DeepSeek V3.1 calls tools in non-thinking mode)
        a2 = ep.ask(msgs, content="I cannot look it up; Lima is mild all year.", reasoning="No tool in thinking mode.",
                    tools=TOOLS, want_continue=False)
    if a2 is None:
        return [msgs]
    msgs += [a2, {"role": "user", "content": "And tomorrow?"}]
    a3 = ep.ask(msgs, content="Probably the same.", reasoning="Weather is stable there.", tools=TOOLS)
    if a3 is not None:
        msgs.append(a3)
    return [msgs]


DEV_ONE = "DEV-ONE: you run in a sandbox; ask before writing outside the workspace."
DEV_TWO = "DEV-TWO: collaboration mode is pairing; explain each change."


def _ep_developer(ep: Episode, head: list[dict[str, Any]], api: str = "chat") -> list[list[dict]]:
    msgs = head + [{"role": "user", "content": "Which file holds the failing test?"}]
    a1 = ep.ask(msgs, content="tests/test_parse.py holds it.", want_continue=False, api=api)
    if a1 is None:
        return [msgs]
    msgs += [a1, {"role": "user", "content": "Fix it."}]
    a2 = ep.ask(msgs, content="Fixed: the parser now strips the newline.", api=api)
    if a2 is not None:
        msgs.append(a2)
    return [msgs]


def run_cell(gw: Any, fam: Family, scenario: str, spy: _DecisionSpy) -> Cell:
    """Run one scenario on the family's gateway, finish it, and check every call and the rows."""
    cell = Cell(fam.name, scenario)
    if scenario == "thinking" and not fam.thinking:
        cell.applicable = False
        return cell
    ep = Episode(gw, fam, spy, raw=scenario == "tool_loop_raw", thinking=scenario == "thinking")
    dev = [{"role": "developer", "content": DEV_ONE}, {"role": "developer", "content": DEV_TWO}]
    # Chat Completions: the second as a list of text parts, as some harnesses send it
    dev_parts = [dev[0], {"role": "developer", "content": [{"type": "text", "text": DEV_TWO}]}]
    run = {"tool_loop": _ep_tool_loop, "tool_loop_raw": _ep_tool_loop, "second_user": _ep_second_user,
           "compaction": _ep_compaction, "thinking": _ep_thinking,
           "developer": lambda ep: _ep_developer(ep, dev_parts),
           "developer_after_system": lambda ep: _ep_developer(ep, [{"role": "system", "content": SYSTEM}, dev[0]]),
           "developer_responses": lambda ep: _ep_developer(ep, dev, "responses")}[scenario]
    conversations = run(ep)
    check_calls(cell, ep)
    if all(s.response is not None for s in ep.steps):
        check_rows(cell, ep, conversations)
    else:
        cell.rows_ok = False
    return cell


# -- the checks ----------------------------------------------------------------------------------------


def check_calls(cell: Cell, ep: Episode) -> None:
    gw, fam = ep.gw, ep.fam
    tok = gw.engine.tokenizer
    renderer = gw.gateway.renderer
    by_id = {c.id: c for c in gw.ledger.calls(ep.ro["rollout_id"])}
    cell.calls = len(ep.steps)
    for k, st in enumerate(ep.steps):
        where = f"call {k + 1}"
        cell.expected_continuations += st.want_continue
        if st.response is None:
            cell.accepted = False
            cell.fail(f"{where}: refused: {st.error}")
            continue
        # accepted: parsed as scripted
        msg = _reply(st)
        got_calls = [(tc.function.name, json.loads(tc.function.arguments)) for tc in msg.tool_calls or ()]
        if got_calls != st.want_calls:
            cell.accepted = False
            cell.fail(f"{where}: tool_calls {got_calls} != {st.want_calls}")
        want_content = st.want_content or None
        if (msg.content or None) != want_content:
            if (msg.content or "").strip() == (want_content or ""):
                cell.notes.append(f"{where}: content {msg.content!r} carries template whitespace")
            else:
                cell.accepted = False
                cell.fail(f"{where}: content {msg.content!r} != {want_content!r}")
        got_reasoning = getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")
        if (got_reasoning or None) != st.want_reasoning:
            cell.accepted = False
            cell.fail(f"{where}: reasoning_content {got_reasoning!r} != {st.want_reasoning!r}")
        if fam.name == "mistral-nemo":
            for tc in msg.tool_calls or ():
                if len(tc.id) != 9 or not tc.id.isalnum():
                    cell.accepted = False
                    cell.fail(f"{where}: Mistral tool-call id {tc.id!r} is not 9 alphanumerics")
        call = by_id.get(st.call_id)
        if call is None:
            cell.accepted = False
            cell.fail(f"{where}: no ledger call {st.call_id}")
            continue
        # root or continuation, and to which parent
        if not call.root:
            cell.continued += st.want_continue
            source = ep.sources.get(id(st.messages[st.parent_msg])) if st.parent_msg is not None else None
            if call.parent_id != source:
                cell.fallback_ok = False
                cell.fail(f"{where}: continues {call.parent_id}, but the last assistant message came from {source}")
            if not st.want_continue:
                cell.fallback_ok = False
                cell.fail(f"{where}: a continuation where a root was expected ({st.want_reason})")
        else:
            if st.want_continue:
                cell.fail(f"{where}: a root ({st.reason}) where a continuation was expected")
            if st.want_reason is not None and st.reason != st.want_reason:
                cell.fallback_ok = False
                cell.fail(f"{where}: root reason {st.reason!r}, expected {st.want_reason!r}")
        if call.history_drift:
            cell.drift += 1
        # token-exact
        full = full_prompt(gw.ledger, call)
        if st.engine_prompt != full:
            cell.token_exact = False
            cell.fail(f"{where}: the engine was asked another prompt than the ledger's")
        usage = st.response.usage.input_tokens if st.api == "responses" else st.response.usage.prompt_tokens
        if usage != len(full) or call.prompt_len != len(full):
            cell.token_exact = False
            cell.fail(f"{where}: usage.prompt_tokens {usage} / prompt_len "
                      f"{call.prompt_len} != {len(full)}")
        sampled = call.sampled_ids.tolist()
        if sampled != tok.encode(st.script, add_special_tokens=False):
            cell.token_exact = False
            cell.fail(f"{where}: sampled ids are not the script's tokens")
        mapped = mapped_messages(st.messages, "developer" in tok.chat_template)
        prepared = engine_messages(mapped, renderer.content_format)
        text = tok.apply_chat_template(prepared, tools=st.tools, add_generation_prompt=True, tokenize=False,
                                       **st.kwargs)
        expected = tok.encode(text, add_special_tokens=False)
        sent = renderer.decode(full)
        for m in st.messages:
            instruction = cell.scenario in DEVELOPER and m.get("role") in ("system", "developer")
            said = _text(m["content"]) if instruction else None
            if said is not None and (said not in text or said not in sent):
                cell.instructions_ok = False
                cell.fail(f"{where}: the {m['role']} text {said!r} is not in the "
                          f"{'rendering' if said not in text else 'prompt'}")
                break
        for m in st.messages:
            if m.get("role") == "tool" and (m["content"] not in text or "{'type': 'text'" in text):
                cell.tool_results_ok = False
                cell.fail(f"{where}: the tool result {m['content']!r} is not in the prompt as sent "
                          f"(the template writes {_around(text, m['content'])!r})")
                break
        if call.root:
            if call.history_drift:
                cell.token_exact = False
                cell.fail(f"{where}: a root marked history_drift")
            if full != expected:
                cell.token_exact = False
                cell.fail(f"{where}: root prompt != the template's rendering ({_diff(tok, full, expected)})")
            continue
        parent = by_id[call.parent_id]
        ctx = full_prompt(gw.ledger, parent) + parent.sampled_ids.tolist()
        drift_expected = not text.startswith(renderer.decode(ctx))
        if call.history_drift != drift_expected:
            cell.token_exact = False
            cell.fail(f"{where}: history_drift={call.history_drift}, but the rendering "
                      f"{'does not start' if drift_expected else 'starts'} with the parent's context")
        if full[: len(ctx)] != ctx:
            cell.token_exact = False
            cell.fail(f"{where}: does not start with the parent's exact context")
            continue
        if not call.history_drift:
            if full != expected:
                cell.token_exact = False
                cell.fail(f"{where}: continuation prompt != the template's rendering ({_diff(tok, full, expected)})")
            continue
        b = _turn_boundary(fam, text, st.messages[st.parent_msg + 1:])
        if b is None:
            cell.token_exact = False
            cell.fail(f"{where}: no turn-end marker before the new messages in the rendering")
            continue
        whole = tok.encode(text, add_special_tokens=False)
        head = tok.encode(text[:b], add_special_tokens=False)
        rest = full[len(ctx):]
        if whole[: len(head)] != head or rest != whole[len(head):]:
            cell.token_exact = False
            cell.fail(f"{where}: drift continuation's new part != the rendering after the parent's turn "
                      f"({renderer.decode(rest)!r} vs {text[b:]!r})")


def _reply(st: Step) -> Any:
    """The reply as a Chat Completions message (content, tool_calls, reasoning) for either API."""
    if st.api != "responses":
        return st.response.choices[0].message
    from openai.types.chat import ChatCompletionMessage

    return ChatCompletionMessage(role="assistant", content=st.response.output_text or None)


def _turn_boundary(fam: Family, text: str, new_messages: Sequence[Mapping[str, Any]]) -> int | None:
    """End of the last turn-end marker of the family before the first new message's text."""
    first = new_messages[0].get("content") if new_messages else None
    if not isinstance(first, str) or not first:
        return None
    p = text.rfind(first)
    if p < 0:
        return None
    ends = [text.rfind(m, 0, p) + len(m) for m in TURN_END[fam.name] if text.rfind(m, 0, p) >= 0]
    return max(ends) if ends else None


def _around(text: str, needle: str) -> str:
    k = text.find(needle)
    if k < 0:
        k = text.find(needle[: len(needle) // 2])
    return text[max(k - 40, 0): k + len(needle) + 40] if k >= 0 else text[-120:]


def _diff(tok: Any, got: list[int], want: list[int]) -> str:
    n = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return (f"first difference at token {n} of {len(got)}/{len(want)}: "
            f"{tok.decode(got[n:n + 12])!r} vs {tok.decode(want[n:n + 12])!r}")


def check_rows(cell: Cell, ep: Episode, conversations: list[list[dict]]) -> None:
    gw = ep.gw
    rid = ep.ro["rollout_id"]
    if len(conversations) == 1:
        gw.finish(rid, messages=conversations[0], reward=1.0)
    else:
        gw.finish(rid, conversations=conversations, reward=1.0)
    out = gw.rows(rid)
    calls = {c.id: c for c in gw.ledger.calls(rid)}
    if out["invalid_reason"] is not None:
        cell.rows_ok = False
        cell.fail(f"rows invalid: {out['invalid_reason']}")
    trained: set[str] = set()
    for row in out["rows"]:
        if not row["valid"]:
            cell.rows_ok = False
        want: list[int] = []
        for cid in row["call_ids"]:
            if cid not in trained:
                want += calls[cid].sampled_ids.tolist()
                trained.add(cid)
        got = [t for t, m in zip(row["input_ids"], row["loss_mask"], strict=True) if m]
        if got != want:
            cell.rows_ok = False
            cell.fail(f"row {row['segment']}: loss-masked tokens != the sampled ids of its calls")
        leaf = calls[row["call_ids"][-1]]
        if row["input_ids"] != full_prompt(gw.ledger, leaf) + leaf.sampled_ids.tolist():
            cell.rows_ok = False
            cell.fail(f"row {row['segment']}: input_ids != its leaf call's context")
    if trained != set(calls):
        cell.rows_ok = False
        cell.fail(f"calls never trained: {sorted(set(calls) - trained)}")


# -- the table -----------------------------------------------------------------------------------------


def _rate(cells: Sequence[Cell]) -> str:
    cells = [c for c in cells if c.applicable]
    if not cells:
        return "n/a"
    want = sum(c.expected_continuations for c in cells)
    got = sum(c.continued for c in cells)
    return f"{got}/{want}" if got == want else f"**{got}/{want}**"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def matrix_table(cells: Sequence[Cell]) -> str:
    """The conformance matrix as a markdown table (one row per family)."""
    lines = ["| family | accepted | tool loop | second user turn | compaction | thinking | developer messages "
             "| token-exact | history-drift calls | correct fallback | rows valid | tool results in prompt "
             "| instructions in prompt |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in NAMES:
        mine = [c for c in cells if c.family == name and c.applicable]
        by = {c.scenario: c for c in cells if c.family == name}
        drift = ", ".join(f"{LABELS[s]} {by[s].drift}" for s in SCENARIOS
                          if s in by and by[s].applicable and by[s].drift) or "0"
        lines.append("| " + " | ".join([
            name, _yes(all(c.accepted for c in mine)),
            _rate([by[s] for s in ("tool_loop", "tool_loop_raw") if s in by]),
            _rate([by["second_user"]] if "second_user" in by else []),
            _rate([by["compaction"]] if "compaction" in by else []),
            _rate([by["thinking"]] if "thinking" in by else []),
            _rate([by[s] for s in DEVELOPER if s in by]),
            _yes(all(c.token_exact for c in mine)), drift,
            _yes(all(c.fallback_ok for c in mine)), _yes(all(c.rows_ok for c in mine)),
            _yes(all(c.tool_results_ok for c in mine)), _yes(all(c.instructions_ok for c in mine)),
        ]) + " |")
    return "\n".join(lines)


def facts_table(matrix: Matrix) -> str:
    """Per family: template, the parsers and tool-call id style the gateway detects from it, and
    the stop tokens of the model folder's generation_config.json."""
    lines = ["| family | chat template | tool parser | reasoning parser | stop tokens (generation_config.json) "
             "| tool-call ids |", "|---|---|---|---|---|---|"]
    for name in NAMES:
        gw = matrix.gateway(name)
        g = gw.gateway
        config = json.loads((suite_model_dir(name) / "generation_config.json").read_text(encoding="utf-8"))
        eos = config["eos_token_id"]
        eos = eos if isinstance(eos, list) else [eos]
        stops = ", ".join(f"`{_cell_text(t)}`" for t in g.tokenizer.convert_ids_to_tokens(eos))
        ids = {"openai": "`call_` + 24 hex", "mistral": "9 alphanumerics", "kimi": "`functions.NAME:IDX`"}
        reasoning = f"`{g.reasoning_parser}`" if g.reasoning_parser else "none"
        lines.append(f"| {name} | `{family(name).template_file}` | `{g.tool_parser}` | {reasoning} "
                     f"| {stops} | {ids.get(g.tool_call_ids, g.tool_call_ids)} |")
    return "\n".join(lines)


def _cell_text(text: str) -> str:
    """Text for a markdown table cell: a `|` (even in a code span) must be escaped."""
    return text.replace("|", "\\|")


def generated_block(matrix: Matrix) -> str:
    """What the markers of docs/families.md enclose: the matrix, then the families' facts."""
    return matrix_table(matrix.all_cells()) + "\n\n" + facts_table(matrix)


def doc_table(text: str) -> str | None:
    """The table between the markers in docs/families.md (None when the markers are missing)."""
    a, b = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if a < 0 or b < a:
        return None
    return text[a + len(TABLE_BEGIN):b].strip()


def write_docs(table: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    a, b = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if a < 0 or b < a:
        raise SystemExit(f"{DOC} has no {TABLE_BEGIN} ... {TABLE_END} markers")
    DOC.write_text(text[: a + len(TABLE_BEGIN)] + "\n\n" + table + "\n\n" + text[b:], encoding="utf-8")


# -- the tests -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def matrix():
    m = Matrix()
    try:
        yield m
    finally:
        m.close()


def _params():
    out = []
    for name in NAMES:
        for scenario in SCENARIOS:
            reason = KNOWN_FAILURES.get((name, scenario))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, scenario, id=f"{name}-{scenario}", marks=marks))
    return out


@pytest.mark.parametrize(("name", "scenario"), _params())
def test_cell(matrix, name, scenario):
    cell = matrix.cell(name, scenario)
    if not cell.applicable:
        pytest.skip(f"{name} does not think")
    assert cell.ok, f"{name} / {scenario}:\n  " + "\n  ".join(cell.problems)


def test_docs_table(matrix):
    """docs/families.md holds the table this matrix computes (rewrite it with --write-docs)."""
    table = generated_block(matrix)
    have = doc_table(DOC.read_text(encoding="utf-8")) if DOC.is_file() else None
    assert have == table, (
        "docs/families.md disagrees with the conformance matrix; run "
        "`python tests/gateway/test_conformance.py --write-docs`, or paste:\n\n" + table)


if __name__ == "__main__":
    t0 = time.perf_counter()
    m = Matrix()
    try:
        cells = m.all_cells()
        table = generated_block(m)
    finally:
        m.close()
    print(table)
    for c in cells:
        if c.problems or c.notes:
            print(f"\n{c.family} / {c.scenario}:\n  " + "\n  ".join(c.problems + [f"(note) {n}" for n in c.notes]))
    print(f"\n{len(cells)} cells in {time.perf_counter() - t0:.1f} s")
    if "--write-docs" in sys.argv[1:]:
        write_docs(table)
        print(f"wrote {DOC}")
