"""Chains and rows: a finished rollout's accepted calls → one training row per chain. Pure: no I/O.

    record ──select──▶ accepted calls ──cut at roots──▶ a tree per root
       ──leaves (accepted, no accepted descendant)──▶ walk leaf → root
       ──join stored tokens──▶ root prompt, sampled, new part, sampled, … = one row

Masks. `loss_mask` is 1 exactly on the sampled tokens of accepted calls, and only in the first
row (segment order) that holds them: where two accepted leaves share ancestors (parallel
branches, a sub-agent forked from the conversation) the shared sampled tokens are trained once.
Prompts, template glue, tool outputs and summaries are 0. `logprobs` holds the engine's logprob
at every sampled position and 0 elsewhere; `weight_versions` the weight version that sampled
each sampled position and -1 elsewhere (None when a call of the chain has no recorded versions).
Segments are numbered by (root ordinal, leaf ordinal).

Validity. The rollout is invalid — every row `valid=False` with `mask_reason` — when an assistant
message of the record matches no call, an ancestor of an accepted leaf is not accepted (the record
skipped a turn the model took), a call on a chain did not complete, the stored prompt lengths do
not add up, the harness finished it with `valid=false`, or an infrastructure failure hit a call
the rollout needed (below). Its rows are still built and returned.

Infrastructure failures are never reward 0. A call that did not complete — `failed` (engine error,
engine timeout, a bad generation), `aborted` (client gone, server restarted mid-call, a response
that was not delivered) or still `pending` — is an infrastructure failure, except a call the
engine refused as the request's own fault (its error starts "BadRequest:": the server answered
the request 400). The rollout *needed* such a call F unless a later call (higher ordinal) of the
same rollout completed with F's `request_hash` — the same messages, tools and template options:
the SDK's retry of F or the harness's own retry of that request — and so took its place. A needed
infrastructure failure makes the rollout invalid (`infra_failure`, naming F and its error)
whatever its reward: a harness that scored the episode after a 504 scored the infrastructure,
not the model. A replacement does not have to be accepted by the record: a completed answer to
the same request means the failure cost the harness nothing but a retry.

What a finish trains is decided by its record, the harness's word (`record_shape`):
- `assistant`: the record holds assistant messages (or names `accepted_call_ids`): the matched
  (or named) calls are trained, nothing else.
- `no_reply`: the record holds messages but no assistant message and names no call: the harness
  says it kept no reply (it gave up, or never received one in full), so nothing is trained and the
  rollout is invalid (`nothing_to_train`). The gateway cannot tell a reply that went into the
  socket's buffers from one the client read; the record can, so it is believed.
- `none`: no record at all (`record=None`, `{}`, or `{"conversations": []}`): the rows come from
  the terminal chain of each root's tree (walk up from the tree's last completed call; a
  sub-agent's conversation is a root of its own; non-completed calls are never trained) and `metrics["note"]` says that only part of the rollout may be delivered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowgrove.assemble.select import Match, record_accepted_ids, record_conversations, select_calls
from rowgrove.types import Call, Rollout, Row


REASONS = {
    "unmatched_message": "an assistant message of the record matches no call (text the model did not generate)",
    "missing_parent": "a call names a parent that is not in the ledger",
    "skipped_turn": "a call on an accepted chain matches no message of the record",
    "call_not_completed": "a call on a chain failed or was aborted",
    "inconsistent_ledger": "stored prompt lengths do not add up along a chain",
    "harness_invalid": "the harness finished the rollout with valid=false",
    "nothing_to_train": "no completed or accepted call, or a record that holds no assistant message",
    "unknown_call_id": "accepted_call_ids names a call that is not a completed call of this rollout",
    "infra_failure": "a call the rollout needed failed or was aborted (engine error, timeout, abort, "
                     "undelivered response, server restart) and no later call answered its request",
}

# the error a failed call carries when the engine refused the request as the caller's fault (400)
REFUSED_PREFIX = "BadRequest:"


def needed_failures(calls: list[Call]) -> list[Call]:
    """The infrastructure failures the rollout needed (see the module docstring), in ordinal
    order: calls that did not complete, were not refused as the request's fault, and were not
    answered by a later completed call with the same request_hash."""
    last_completed: dict[str, int] = {}
    for c in calls:
        if c.status == "completed":
            last_completed[c.request_hash] = max(last_completed.get(c.request_hash, 0), c.ordinal)
    return [c for c in calls
            if c.status != "completed" and not (c.error or "").startswith(REFUSED_PREFIX)
            and last_completed.get(c.request_hash, 0) <= c.ordinal]


@dataclass
class RolloutRows:
    """What one finished rollout became.

    `rows` in segment order; `metrics` (see `build_rows`); `invalid_reason` is None for a valid
    rollout. `accepted` (call ids in ordinal order), `chains` (per row, call ids root → leaf) and
    `matches` (record message → call) are kept for the lineage picture and for debugging.
    """

    rows: list[Row]
    metrics: dict[str, Any]
    invalid_reason: str | None
    rollout_id: str = ""
    accepted: list[str] = field(default_factory=list)
    chains: list[list[str]] = field(default_factory=list)
    matches: list[Match] = field(default_factory=list)
    reason_kinds: list[str] = field(default_factory=list)   # one short code per reason, see REASONS

    @property
    def valid(self) -> bool:
        return self.invalid_reason is None


def _preview(msg: Any, width: int = 40) -> str:
    content = msg.get("content") if isinstance(msg, dict) else None
    text = content if isinstance(content, str) else ("<tool calls>" if isinstance(msg, dict) and msg.get("tool_calls") else "")
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 1] + "…")


def _leaves(accepted: set[str], by_id: dict[str, Call]) -> list[str]:
    """Accepted calls with no accepted descendant. Each ancestor is marked once."""
    has_desc: set[str] = set()
    for cid in accepted:
        pid = by_id[cid].parent_id
        while pid is not None and pid not in has_desc:
            has_desc.add(pid)
            p = by_id.get(pid)
            pid = p.parent_id if p is not None else None
    return [cid for cid in accepted if cid not in has_desc]


def record_shape(record: Any) -> str:
    """Which finish shape a record is, and so what it trains (see the module docstring):
    "assistant" (assistant messages, or `accepted_call_ids`: the matched calls), "no_reply"
    (messages but none from the assistant: nothing, `nothing_to_train`) or "none" (no message at
    all: the terminal chain). InputError for a record that is not an object."""
    convs = record_conversations(record)
    if record_accepted_ids(record) or any(
        isinstance(m, Mapping) and m.get("role") == "assistant" for conv in convs for m in conv
    ):
        return "assistant"
    if any(conv for conv in convs):
        return "no_reply"
    return "none"


def build_rows(rollout: Rollout, calls: list[Call]) -> RolloutRows:
    """Rows of one finished rollout from its calls (any order; ordinals decide).

    Promises: every position with loss mask 1 holds a token the engine sampled, with its logprob
    and (when recorded) the weight version that sampled it (promise 1); every row carries
    `rollout.reward` (promise 2); a rollout whose record cannot be traced to its calls still
    yields its rows, marked invalid with the reason (promise 5).

    metrics: calls, roots, accepted_calls, rejected_calls (completed, never trained),
    failed_calls (failed, aborted or pending), unmatched_messages, rows, row_tokens,
    prompt_tokens (mask-0 positions over all rows), trained_tokens (mask-1 positions),
    generated_tokens (sampled by the engine over all completed calls), delivered_fraction
    (trained_tokens / generated_tokens: 1.0 when every generated token is trained; rejections and
    a missing record lower it), source ("record" | "terminal_chain"), note.
    """
    if any(a.ordinal >= b.ordinal for a, b in zip(calls, calls[1:])):
        calls = sorted(calls, key=lambda c: c.ordinal)
    by_id = {c.id: c for c in calls}
    reasons: list[tuple[str, str]] = []   # (kind, explanation)

    def fail(kind: str, text: str) -> None:
        reasons.append((kind, text))

    note: str | None = None
    matches: list[Match] = []
    convs = record_conversations(rollout.record)
    shape = record_shape(rollout.record)
    if shape == "no_reply":
        source = "record"
        accepted = set()
        n = sum(len(conv) for conv in convs)
        fail("nothing_to_train",
             f"the record holds {n} message(s) and no assistant message: the harness kept no reply of the "
             "model, so nothing is trained (send the model's replies as assistant messages, or finish with "
             "no record at all, e.g. {\"conversations\": []}, to train the terminal chain)")
    elif shape == "assistant":
        source = "record"
        sel = select_calls(rollout.record, calls)
        for kind, text in sel.problems:
            fail(kind, text)
        accepted = sel.accepted
        matches = sel.matches
        unmatched = sel.unmatched
        if unmatched:
            where = ", ".join(
                f"conversation {m.conversation} message {m.message} {_preview(convs[m.conversation][m.message])}"
                for m in unmatched[:3]
            )
            more = f" (+{len(unmatched) - 3} more)" if len(unmatched) > 3 else ""
            fail("unmatched_message",
                f"{len(unmatched)} assistant message(s) of the record match no call ({where}{more}): "
                "text the model did not generate is never trained; send the model's replies unchanged"
            )
    else:
        source = "terminal_chain"
        # each root's tree gives its terminal chain (walk up from its last completed call): a
        # sub-agent's conversation (Claude Code's Agent tool, Codex's spawn_agent) is a root of its
        # own, and trains beside the main conversation under the rollout's one reward
        lasts: dict[str, Call] = {}
        root_of: dict[str, str] = {}  # call id -> its tree's root; a parent comes before its children
        for c in calls:
            root = root_of[c.id] = root_of.get(c.parent_id, c.id) if c.parent_id is not None else c.id
            if c.status == "completed":
                lasts[root] = c
        accepted = set()
        for last in lasts.values():
            cid: str | None = last.id
            while cid is not None and cid in by_id:
                accepted.add(cid)
                cid = by_id[cid].parent_id
        tails = sorted(lasts.values(), key=lambda c: c.ordinal)
        note = (
            "the finish carried no record: rows come from the terminal chain of each root only "
            f"(walk up from {', '.join(c.id for c in tails[:5])}{' …' if len(tails) > 5 else ''}), "
            "so only part of the rollout may be delivered"
            if tails else "the finish carried no record and no call completed"
        )
    if not rollout.valid:
        fail("harness_invalid", "the harness finished the rollout with valid=false")
    infra = needed_failures(calls)
    if infra:
        fail("infra_failure",
             f"{len(infra)} call(s) the rollout needed did not complete and no later call answered the same "
             "request: "
             + ", ".join(f"{c.id} ({c.status}: {c.error or 'no error recorded'})" for c in infra[:3])
             + (f" (+{len(infra) - 3} more)" if len(infra) > 3 else "")
             + ": an infrastructure failure is never a reward; retry the request, or drop the rollout")

    leaves = sorted(_leaves(accepted, by_id), key=lambda cid: by_id[cid].ordinal)
    chains: list[list[Call]] = []
    for leaf in leaves:
        chain: list[Call] = []
        cid: str | None = leaf
        while cid is not None:
            c = by_id.get(cid)
            if c is None:
                fail("missing_parent", f"call {chain[-1].id} names parent {cid}, which is not in the ledger")
                break
            chain.append(c)
            cid = c.parent_id
        chain.reverse()
        chains.append(chain)
    chains.sort(key=lambda ch: (ch[0].ordinal, ch[-1].ordinal))

    skipped = sorted({c.id for ch in chains for c in ch if c.id not in accepted}, key=lambda i: by_id[i].ordinal)
    if skipped:
        fail("skipped_turn",
            f"calls {', '.join(skipped[:5])}{' …' if len(skipped) > 5 else ''} lie on the chain of an accepted "
            "call but no assistant message of the record matches them: the record skipped a turn the model took"
        )
    broken = sorted({c.id for ch in chains for c in ch if c.status != "completed"}, key=lambda i: by_id[i].ordinal)
    if broken:
        fail("call_not_completed",
            "calls on a chain did not complete: "
            + ", ".join(f"{i} ({by_id[i].status}: {by_id[i].error or 'no error recorded'})" for i in broken[:5])
        )

    rows: list[Row] = []
    trained: set[str] = set()
    for seg, chain in enumerate(chains):
        pieces: list[np.ndarray] = []
        spans: list[tuple[int, int, Call]] = []
        pos = 0
        for c in chain:
            expect = len(c.prompt_ids) if c.parent_id is None else pos + len(c.prompt_ids)
            if c.prompt_len != expect:
                fail("inconsistent_ledger",
                    f"call {c.id}: the engine saw {c.prompt_len} prompt tokens but its chain gives {expect}: "
                    "the ledger is inconsistent"
                )
            pieces.append(c.prompt_ids)
            pos += len(c.prompt_ids)
            pieces.append(c.sampled_ids)
            spans.append((pos, pos + len(c.sampled_ids), c))
            pos += len(c.sampled_ids)
        input_ids = np.concatenate(pieces).astype(np.int32, copy=False) if pieces else np.zeros(0, np.int32)
        loss_mask = np.zeros(pos, np.int32)
        logprobs = np.zeros(pos, np.float32)
        known = all(c.weight_versions is not None for c in chain)
        versions = np.full(pos, -1, np.int32) if known else None
        for a, b, c in spans:
            logprobs[a:b] = c.logprobs
            if versions is not None:
                if len(c.weight_versions) != b - a:
                    fail("inconsistent_ledger",
                        f"call {c.id}: {b - a} sampled ids but {len(c.weight_versions)} weight versions: "
                        "the ledger is inconsistent")
                    versions = None
                else:
                    versions[a:b] = c.weight_versions
            if c.id in accepted and c.id not in trained and c.status == "completed":
                loss_mask[a:b] = 1
                trained.add(c.id)
        rows.append(Row(
            rollout_id=rollout.id, group_id=rollout.group_id, input_ids=input_ids, loss_mask=loss_mask,
            reward=rollout.reward, valid=True, advantage=None, logprobs=logprobs, segment=seg,
            call_ids=[c.id for c in chain], mask_reason=None, weight_versions=versions,
        ))

    if not rows and not reasons:
        fail("nothing_to_train", "no completed call to build a row from" if not calls else
                       "no accepted call: nothing of this rollout can be trained")
    invalid_reason = "; ".join(dict.fromkeys(text for _, text in reasons)) if reasons else None
    if invalid_reason is not None:
        for r in rows:
            r.valid = False
            r.mask_reason = invalid_reason

    completed = [c for c in calls if c.status == "completed"]
    generated = sum(len(c.sampled_ids) for c in completed)
    row_tokens = sum(len(r.input_ids) for r in rows)
    trained_tokens = sum(len(by_id[i].sampled_ids) for i in trained)
    metrics: dict[str, Any] = {
        "calls": len(calls),
        "roots": sum(1 for c in calls if c.parent_id is None),
        "accepted_calls": len(accepted),
        "rejected_calls": sum(1 for c in completed if c.id not in accepted),
        "failed_calls": len(calls) - len(completed),
        "unmatched_messages": sum(1 for m in matches if m.call_id is None),
        "rows": len(rows),
        "row_tokens": row_tokens,
        "prompt_tokens": row_tokens - trained_tokens,
        "trained_tokens": trained_tokens,
        "generated_tokens": generated,
        "delivered_fraction": trained_tokens / generated if generated else 1.0,
        "source": source,
        "note": note,
    }
    return RolloutRows(
        rows=rows, metrics=metrics, invalid_reason=invalid_reason, rollout_id=rollout.id,
        accepted=sorted(accepted, key=lambda i: by_id[i].ordinal),
        chains=[[c.id for c in ch] for ch in chains], matches=matches,
        reason_kinds=list(dict.fromkeys(kind for kind, _ in reasons)),
    )
