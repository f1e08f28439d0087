"""What one gateway actor runs: a real gateway (rowgrove.gateway) with its own engine and its own
ledger, in the actor's process, listening on the node's loopback (episode tasks are placed on
the same node). The pool wraps this class with `ray.remote`; without Ray it is a plain object."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any


class GatewayServer:
    """A gateway on `model` in front of `engine` ("scripted" | "hf" | "vllm" | "sglang";
    `engine_options` go to `rowgrove.engines.make_engine`, e.g. `url` for a server), writing
    `ledger`. `threads`: torch intra-op threads in this process (local engines)."""

    def __init__(self, model: str, engine: str, ledger: str, *, engine_options: dict[str, Any] | None = None,
                 threads: int | None = 1, settings: dict[str, Any] | None = None):
        from rowgrove.engines import make_engine
        from rowgrove.gateway.testing import launch_gateway

        if threads:
            import torch

            torch.set_num_threads(threads)
        Path(ledger).parent.mkdir(parents=True, exist_ok=True)
        self._engine = make_engine(engine, model, **(engine_options or {}))
        self._handle = launch_gateway(model, self._engine, ledger, **{"model_name": "policy", **(settings or {})})
        self._ledger = ledger

    def info(self) -> dict[str, Any]:
        """{url, ledger, pid, node_id}: where the gateway listens and writes."""
        node = None
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - outside Ray there is no node
            node = None
        return {"url": self._handle.url, "ledger": self._ledger, "pid": os.getpid(), "node_id": node}

    def ping(self) -> bool:
        return True

    def open_rollouts(self) -> list[str]:
        """Ids of the rollouts still open in this gateway's ledger."""
        return [ro.id for ro in self._handle.ledger.rollouts("open")]

    def update_weights(self, state_dict: Any) -> int:
        """Load the trainer's weights into this gateway's engine; returns its weights version."""
        self._engine.update_weights(state_dict)
        return int(self._engine.weights_version)

    def close(self) -> None:
        self._handle.close()
        asyncio.run(self._engine.aclose())
