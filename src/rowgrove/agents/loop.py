"""The reference agent harness: drive a model through tool calls with any OpenAI-compatible async
client, reject and resample bad responses a bounded number of times, compact the context by a
chosen policy, and return the whole accepted conversation with the environment's reward.

    task prompt ──► model call ──► parse tool calls ──► reject? ──yes──► same request again (≤ R)
                        ▲                                 │no
                        │                                 ▼
            compact every k actions ◄── tool message ◄── env.step

Rules the rows depend on:
- an accepted assistant message is kept exactly as the client returned it (the SDK message dumped
  without `None` fields: role, content, tool_calls, reasoning_content if any) and sent back
  unchanged, so the gateway finds it by hash;
- a rejected response is never added to any context or to the record: the retry is the same
  request again, which the gateway serves as a sibling of the rejected call;
- the harness never writes assistant text itself. When the resamples are exhausted the episode
  ends there: masked (`valid=False`, AgentConfig.on_exhausted="invalid", the default) or scored
  with the environment's reward so far ("score").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from rowgrove.agents.compaction import Message, Round, compact, keep_newest_images, render_context
from rowgrove.agents.config import AgentConfig
from rowgrove.envs.base import Env, Task

ExtraBody = Mapping[str, Any] | Callable[[int, int], Mapping[str, Any] | None] | None
"""A fixed `extra_body` for every call, or a function (action index, attempt) -> extra_body."""


class AsyncChatClient(Protocol):
    """What the loop needs of `openai.AsyncOpenAI`: `client.chat.completions.create(...)`."""

    chat: Any


@dataclass
class EpisodeResult:
    """One episode of the harness.

    `messages` is the whole accepted conversation across compactions (system?, user, then every
    accepted assistant turn exactly as generated, each followed by its original tool results):
    what goes to the gateway's /finish. `reward` is the environment's final reward, `actions` the
    accepted tool calls, `rejected` the responses rejected and resampled, `compactions` the context
    rewrites, `calls` all model calls. `valid` is False when the episode broke (an error,
    in `info["error"]`) or, with on_exhausted="invalid", when every resample of an action was
    rejected. `info["end"]` says why it ended: "done" | "max_actions" |
    "resamples_exhausted" | "error"; `info["rejections"]` lists the rejection reasons.
    """

    messages: list[Message]
    reward: float
    actions: int
    rejected: int
    compactions: int
    calls: int
    valid: bool = True
    info: dict[str, Any] = field(default_factory=dict)


def assistant_dict(message: Any) -> Message:
    """The assistant message as a plain dict, exactly as the client returned it minus `None`
    fields (pydantic SDK objects are dumped; dicts from fakes are copied)."""
    if isinstance(message, Mapping):
        return {k: v for k, v in message.items() if v is not None}
    return message.model_dump(exclude_none=True)


def check_response(message: Message, env: Env) -> tuple[list[tuple[str, str, dict[str, Any]]], str | None]:
    """([(tool_call_id, name, arguments), ...], None) for an acceptable response, or ([], reason).

    Acceptable: at least one tool call, every call names a tool of `env`, its arguments are a
    JSON object, and `env.check_action` accepts it (schema and task rules).
    """
    tool_calls = message.get("tool_calls") or []
    if not tool_calls:
        return [], "no tool call in the response"
    calls = []
    for tc in tool_calls:
        fn = tc.get("function") or {}
        name = fn.get("name", "")
        raw = fn.get("arguments", "")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            return [], f"arguments of {name!r} are not JSON ({exc.msg})"
        reason = env.check_action(name, args)
        if reason is not None:
            return [], reason
        calls.append((tc.get("id", ""), name, args))
    return calls, None


def observation_messages(call_id: str, observation: Any) -> list[Message]:
    """The messages a tool result becomes: one tool message for text; for content parts with
    images, a tool message of their text and a user message with the images (OpenAI's tool
    messages take text only; computer-use harnesses send the screenshot as the next user turn)."""
    if isinstance(observation, str):
        return [{"role": "tool", "tool_call_id": call_id, "content": observation}]
    parts = list(observation)
    if parts and parts[0].get("type") == "text":
        text, rest = parts[0]["text"], parts[1:]
    else:
        text, rest = "ok", parts
    out: list[Message] = [{"role": "tool", "tool_call_id": call_id, "content": text}]
    if rest:
        out.append({"role": "user", "content": rest})
    return out


async def run_episode(client: AsyncChatClient, env: Env, task: Task, config: AgentConfig, *,
                      model: str = "policy", extra_body: ExtraBody = None) -> EpisodeResult:
    """Run one episode of `task` in `env` through `client`; see the module docstring for the loop.

    `extra_body` is sent with each call (a function of (action index, attempt) may vary it, e.g.
    to script a test engine). Errors from the client propagate; the caller decides (see
    `run_rollout`, which finishes the rollout as invalid).
    """
    head: list[Message] = []
    if config.system_prompt is not None:
        head.append({"role": "system", "content": config.system_prompt})
    head.append({"role": "user", "content": env.reset(task)})
    record: list[Message] = list(head)
    rounds: list[Round] = []
    omitted = 0
    actions = rejected = compactions = calls = turns = 0
    rejections: list[str] = []
    end = "max_actions"
    accepted_since_drop = False

    while actions < config.max_actions:
        context = render_context(head, rounds, omitted)
        if config.compaction == "keep_newest_image":
            kept = keep_newest_images(context, config.keep_images)
            if kept != context and accepted_since_drop:
                compactions += 1  # a context that drops an image the model saw: a rewrite
            context, accepted_since_drop = kept, False
        accepted: Message | None = None
        steps: list[tuple[str, str, dict[str, Any]]] = []
        for attempt in range(config.max_resamples + 1):
            body = extra_body(actions, attempt) if callable(extra_body) else extra_body
            response = await client.chat.completions.create(
                model=model, messages=context, tools=env.tools, temperature=config.temperature,
                max_tokens=config.max_tokens, **({"extra_body": dict(body)} if body else {}),
            )
            calls += 1
            message = assistant_dict(response.choices[0].message)
            steps, reason = check_response(message, env)
            if reason is None:
                accepted = message
                break
            rejected += 1
            rejections.append(reason)
        if accepted is None:
            end = "resamples_exhausted"
            break
        new_round: Round = [accepted]
        done = False
        for call_id, name, args in steps:
            result = env.step(name, args)
            actions += 1
            new_round.extend(observation_messages(call_id, result.observation))
            if result.done:
                done = True
                break
        record.extend(new_round)
        rounds.append(new_round)
        accepted_since_drop = True
        turns += 1
        if done:
            end = "done"
            break
        if turns % config.every_k == 0 and actions < config.max_actions:
            new_rounds, new_omitted = compact(config.compaction, rounds, omitted, keep_rounds=config.keep_rounds)
            if new_rounds != rounds or new_omitted != omitted:
                compactions += 1
            rounds, omitted = new_rounds, new_omitted

    valid = not (end == "resamples_exhausted" and config.on_exhausted == "invalid")
    return EpisodeResult(messages=record, reward=env.reward(), actions=actions, rejected=rejected,
                         compactions=compactions, calls=calls, valid=valid,
                         info={"end": end, "rejections": rejections, "task_id": task.task_id})
