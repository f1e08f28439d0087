"""The control routes' work, without HTTP: a rollout's finish (its accepted conversation(s) and
reward stored), its lineage, and its training rows (`rowgrove.assemble`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rowgrove.errors import BadRequest, Conflict
from rowgrove.gateway.core.decide import validate_messages
from rowgrove.gateway.sessions import Gateway, RolloutSession
from rowgrove.types import Call

__all__ = ["finish", "lineage", "rows"]


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
        validate_messages(body["messages"], None)
        record: dict[str, Any] = {"messages": body["messages"]}
    else:
        convs = body["conversations"]
        if not isinstance(convs, list) or not all(isinstance(c, list) for c in convs):
            raise BadRequest("'conversations' must be a list of lists of chat messages", param="conversations")
        for c in convs:
            validate_messages(c, None)
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
    calls = gw.ledger.calls(ro.id)
    return {
        "rollout_id": ro.id,
        "group_id": ro.group_id,
        "status": ro.status,
        "continuations": sum(not c.root for c in calls),
        "history_drift_calls": sum(c.history_drift for c in calls),
        "calls": [
            {"id": c.id, "ordinal": c.ordinal, "parent_id": c.parent_id, "root": c.root,
             "status": c.status, "prompt_tokens": c.prompt_len,
             "completion_tokens": int(len(c.sampled_ids)), "finish_reason": c.finish_reason,
             "history_drift": c.history_drift, "weight_version": _version_range(c),
             **_hosted(c)}
            for c in calls
        ],
    }

def _hosted(c: Any) -> dict[str, Any]:
    """`{"hosted_tools_dropped": [type, ...]}` for a call whose request named hosted tools the
    model was not shown (its stored response records them), else nothing."""
    dropped = (c.response or {}).get("hosted_tools_dropped") if isinstance(c.response, dict) else None
    return {"hosted_tools_dropped": dropped} if dropped else {}


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


def _version_range(call: Call) -> list[int] | None:
    """[oldest, newest] weight version over the call's sampled tokens; None when unknown or none."""
    vs = call.weight_versions
    if vs is None or len(vs) == 0:
        return None
    return [int(vs.min()), int(vs.max())]


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
