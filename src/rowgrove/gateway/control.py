"""The control routes' work, without HTTP: a rollout's finish (its accepted conversation(s) and
reward stored), its lineage, and its training rows (`rowgrove.assemble`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rowgrove.errors import BadRequest, Conflict
from rowgrove.gateway.core.decide import validate_messages
from rowgrove.hashing import ROLES
from rowgrove.gateway.sessions import Gateway, RolloutSession

__all__ = ["finish", "lineage", "rows"]


def _chat_messages(messages: list[Any]) -> list[Any]:
    """The messages of a record that a chat template can hold. A harness keeps notes of its own
    in its transcript (mini-swe-agent's `exit` role): such a message is no model turn, so it is
    kept in the record, skipped for matching and counted (`metrics["harness_messages"]`), never
    refused. A message that is not an object, or has no string role, is still refused."""
    return [m for m in messages
            if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and m["role"] not in ROLES)]


def finish(gw: Gateway, session: RolloutSession, body: Any) -> dict[str, Any]:
    """Store the harness's accepted conversation(s) and reward; Conflict if already finished."""
    if not isinstance(body, Mapping):
        raise BadRequest("the finish body must be a JSON object with messages or conversations and reward")
    has_m, has_c = body.get("messages") is not None, body.get("conversations") is not None
    if has_m == has_c:
        raise BadRequest(
            "send exactly one of 'messages' (one accepted conversation) or 'conversations' "
            "(a list of them, e.g. one per sub-agent)", param="messages" if has_m else None,
        )
    if has_m:
        if not isinstance(body["messages"], list):
            raise BadRequest("'messages' must be a list of chat messages", param="messages")
        validate_messages(_chat_messages(body["messages"]), None)
        record: dict[str, Any] = {"messages": body["messages"]}
    else:
        convs = body["conversations"]
        if not isinstance(convs, list) or not all(isinstance(c, list) for c in convs):
            raise BadRequest("'conversations' must be a list of lists of chat messages", param="conversations")
        for c in convs:
            validate_messages(_chat_messages(c), None)
        record = {"conversations": convs}
    if body.get("accepted_call_ids") is not None:
        from rowgrove.assemble.select import check_accepted_call_ids

        record["accepted_call_ids"] = check_accepted_call_ids(body["accepted_call_ids"],
                                                              gw.ledger.calls(session.rollout_id))
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or reward != reward:
        raise BadRequest(f"'reward' must be a number, got {reward!r}", param="reward")
    valid = body.get("valid", True)
    if valid is None:
        valid = True
    if not isinstance(valid, bool):
        raise BadRequest(f"'valid' must be true or false, got {valid!r}", param="valid")
    if session.finished:
        raise Conflict(f"rollout {session.rollout_id} is already finished: start a new rollout")
    if gw.renderer.vision is not None:  # images stored once, the record keeps references
        from rowgrove.gateway.images import store_record_images

        record = store_record_images(record, gw.ledger, gw.renderer.vision.config_record(),
                                     folder=gw.settings.media_folder)
    ro = gw.ledger.finish_rollout(session.rollout_id, record, float(reward), valid)
    session.finished = True
    session.index = None
    session.responses.clear()
    session.checked.clear()
    return {"rollout_id": ro.id, "group_id": ro.group_id, "status": ro.status,
            "reward": ro.reward, "valid": ro.valid}

def lineage(gw: Gateway, session: RolloutSession) -> dict[str, Any]:
    ro = gw.ledger.get_rollout(session.rollout_id)
    calls = gw.ledger.call_outlines(ro.id)
    return {
        "rollout_id": ro.id,
        "group_id": ro.group_id,
        "status": ro.status,
        "continuations": sum(not c.root for c in calls),
        "history_drift_calls": sum(c.history_drift for c in calls),
        "calls": [
            {"id": c.id, "ordinal": c.ordinal, "parent_id": c.parent_id, "root": c.root,
             "status": c.status, "prompt_tokens": c.prompt_len,
             "completion_tokens": c.sampled, "finish_reason": c.finish_reason,
             "history_drift": c.history_drift,
             "weight_version": list(c.weight_range) if c.weight_range is not None else None,
             **({"hosted_tools_dropped": c.hosted_tools_dropped} if c.hosted_tools_dropped else {})}
            for c in calls
        ],
    }


def rows(gw: Gateway, session: RolloutSession) -> dict[str, Any]:
    """The rollout's training rows, built by `rowgrove.assemble` from the ledger."""
    from rowgrove.assemble import rollout_rows, row_to_json

    if not session.finished:
        raise Conflict(f"rollout {session.rollout_id} is not finished: POST its finish route first")
    built = rollout_rows(gw.ledger, session.rollout_id)
    return {
        "rollout_id": session.rollout_id,
        "rows": [row_to_json(r) for r in built.rows],
        "metrics": _jsonable(built.metrics),
        "invalid_reason": built.invalid_reason,
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Mapping):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x
