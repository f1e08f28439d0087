"""A tiny hand-written async stand-in for `openai.AsyncOpenAI`: it answers each
`chat.completions.create` with the next scripted assistant message, wrapped in the SDK's own
`ChatCompletion` type, and records every request (a deep copy of the messages it was sent)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from openai.types.chat import ChatCompletion


def tool_reply(name: str, arguments: dict[str, Any] | str, *, call_id: str = "call_x",
               reasoning: str | None = None, content: str | None = None) -> dict[str, Any]:
    """An assistant message with one tool call, as a gateway would return it."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    msg: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}]}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
    return msg


def text_reply(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


class FakeCompletions:
    def __init__(self, replies: list[dict[str, Any]] | Callable[[dict[str, Any]], dict[str, Any]]):
        self.replies = replies
        self.requests: list[dict[str, Any]] = []

    async def create(self, **kwargs: Any) -> ChatCompletion:
        self.requests.append(copy.deepcopy(kwargs))
        if callable(self.replies):
            message = self.replies(kwargs)
        else:
            message = self.replies[len(self.requests) - 1]
        return ChatCompletion.model_validate({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0, "model": kwargs["model"],
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        })


class FakeChat:
    def __init__(self, completions: FakeCompletions):
        self.completions = completions


class FakeClient:
    """`FakeClient(replies).chat.completions.create(...)`; `.requests` lists what it was sent."""

    def __init__(self, replies: list[dict[str, Any]] | Callable[[dict[str, Any]], dict[str, Any]]):
        self.chat = FakeChat(FakeCompletions(replies))

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.chat.completions.requests
