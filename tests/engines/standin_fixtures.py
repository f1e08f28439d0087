"""Helpers for the server-engine tests (vLLM stand-in over real loopback HTTP).

Import from test modules: `from standin_fixtures import ...` (pytest puts this directory on
sys.path). Nothing here starts a server: each test module starts its stand-in once.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import orjson

USER = [{"role": "user", "content": "hi there"}]


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, every: float = 0.01) -> Any:
    """Poll `pred` until it is truthy (its value) or `timeout` seconds pass (its last value)."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(every)


async def await_for(pred: Callable[[], Any], timeout: float = 10.0) -> Any:
    end = time.monotonic() + timeout
    while not (v := pred()) and time.monotonic() < end:
        await asyncio.sleep(0.01)
    return v


def closed_port_url() -> str:
    """An http URL on a loopback port nobody listens on (connection refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def entry(server: Any, request_id: str) -> dict[str, Any] | None:
    """The stand-in's log entry of one generate request (by X-Request-Id)."""
    return server.state.generation(request_id)


def body_of(server: Any, index: int = -1) -> dict[str, Any]:
    """A request body as the stand-in received it."""
    return server.state.requests[index]


def ending_weights(state_dict: dict[str, Any], delta: float = 0.8) -> dict[str, Any]:
    """The tiny model's weights changed so it samples its end-of-turn token (<|im_end|>, id 2)
    after a few tokens: a random model almost never does, and a turn must end with it to be a
    parent. Every embedding row gets +1 on dimension 0 (which then dominates the final norm's
    output) and row 2 gets 1 + delta there, so (embeddings tied to the output head) id 2's logit
    rises ~8 * delta nats above the rest."""
    new = {k: v.clone() for k, v in state_dict.items()}
    emb = new["model.embed_tokens.weight"]
    emb[:, 0] = 1.0
    emb[2, 0] = 1.0 + delta
    if "lm_head.weight" in new:
        new["lm_head.weight"] = emb.clone()
    return new


@contextmanager
def turns_that_end(server: Any) -> Iterator[None]:
    """Within the block the stand-in samples with `ending_weights`; the old weights come back
    after (loaded straight into its hf engine, not through the server's routes)."""
    model = server.engine.model
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    server.engine.update_weights(ending_weights(before))
    try:
        yield
    finally:
        server.engine.update_weights(before)


def sse_events(raw: bytes) -> list[Any]:
    """The `data:` payloads of a server-sent event stream, JSON-decoded ("[DONE]" kept as text)."""
    out: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[6:]
        out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def as_list(x: Any) -> list:
    return np.asarray(x).tolist()
