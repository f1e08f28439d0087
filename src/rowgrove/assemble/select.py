"""Selection: which calls the harness kept, read from its own record of the rollout.

The record (`{"messages": [...]}` or `{"conversations": [[...], ...]}`) is the harness's whole
semantic history: it spans every compaction and may hold messages that were never sent in that
form (summaries, edited history). Only its assistant messages are matched; each is matched to the
call that produced it by the message's canonical hash (`rowgrove.hashing.message_hash`, compared
with `Call.response_hash`). Calls matched by no message — rejected responses, abandoned retries —
are never trained.

Identical texts (a retry that produced the same reply as the call it replaced, or the same short
answer at two turns) are told apart by the lineage, per conversation, with a small Viterbi pass
over the candidate calls of its assistant messages. A path is scored, in this order:
1. calls in the order the conversation has them (ordinals strictly increasing),
2. the most consecutive matches where the earlier call is an ancestor of the later one
   (a continuation of the previous matched turn beats an unrelated call with the same text),
3. the fewest calls another conversation of the record claims: a record that repeats itself
   (two context windows, two sub-agents or two branches holding the same turns) claims one call
   per message, so each window's calls are trained. The conversations with several candidates
   are picked longest first, each against the picks made before it, then again in turn, each
   against all the others' picks, until no pick changes (4 passes at most),
4. the later calls (sum of ordinals): between two retries with the same text that nothing else
   tells apart, the most recent one, as the gateway picks the most recent parent.
Messages with a single candidate (the usual case) cost one dict lookup.

Harnesses that rewrite the model's turns (smolagents re-sends a tool call as assistant text,
`"Calling tools:\n[...]"`, with every content as a list of parts) leave no assistant message that
matches a call. They name what they kept instead: the finish body's `accepted_call_ids` (the `id`
of each chat.completion kept), stored as `record["accepted_call_ids"]`. Then:
- the accepted calls are the union of the matched ones and the named ones;
- an assistant message that matches no call is taken to be the harness's rewrite of a named call
  that no message matched: such messages and such calls are paired in order (messages in record
  order, calls in ordinal order; `Match.by == "accepted_id"`). Messages left over once the named
  calls run out stay unmatched: the rollout is invalid, as without ids;
- a named id that is not a completed call of this rollout is a problem (`Selection.problems`,
  kind `unknown_call_id`): the rollout cannot be traced to what the model sampled. The gateway's
  finish route can refuse it up front (`check_accepted_call_ids(value, calls)`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rowgrove.errors import BadRequest, InputError
from rowgrove.hashing import message_hash
from rowgrove.types import Call


@dataclass
class Match:
    """One assistant message of the record and the call it was matched to (None: no call made it)."""

    conversation: int
    message: int
    call_id: str | None
    candidates: int
    by: str = "hash"   # "hash": the message's canonical hash; "accepted_id": paired with a named call


@dataclass
class Selection:
    """Accepted call ids (matched by the record, or named by its `accepted_call_ids`), how every
    assistant message was matched, and `problems`: (kind, explanation) pairs that make the rollout
    invalid besides unmatched messages (`unknown_call_id`: a named id that is not a completed
    call of this rollout)."""

    accepted: set[str] = field(default_factory=set)
    matches: list[Match] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def unmatched(self) -> list[Match]:
        return [m for m in self.matches if m.call_id is None]


def record_conversations(record: Mapping[str, Any] | None) -> list[list[Mapping[str, Any]]]:
    """The record's conversations as lists of messages; [] when the harness sent none.

    Accepts `{"messages": [...]}`, `{"conversations": [[...], ...]}` and conversations given as
    `{"messages": [...]}` objects.
    """
    if not record:
        return []
    if not isinstance(record, Mapping):
        raise InputError(f"rollout record must be an object with 'messages' or 'conversations', not {type(record).__name__}")
    convs: list[list[Mapping[str, Any]]] = []
    if record.get("messages"):
        convs.append(list(record["messages"]))
    for i, conv in enumerate(record.get("conversations") or ()):
        if isinstance(conv, Mapping):
            conv = conv.get("messages") or ()
        if not isinstance(conv, Sequence) or isinstance(conv, str | bytes):
            raise InputError(f"record conversation {i} must be a list of messages")
        convs.append(list(conv))
    return convs


def check_accepted_call_ids(value: Any, calls: Sequence[Call] | None = None) -> list[str]:
    """The `accepted_call_ids` of a finish body, checked: a list of call id strings (duplicates
    dropped, order kept). With `calls` (the rollout's calls), an id that is not a completed call
    of this rollout is refused too, naming it: a harness that sends a wrong id learns it at finish
    rather than from an invalid rollout. BadRequest, param `accepted_call_ids`."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest("'accepted_call_ids' must be a list of call id strings (the 'id' of each "
                         "chat.completion the harness kept)", param="accepted_call_ids")
    ids = list(dict.fromkeys(value))
    if calls is not None:
        bad = _bad_ids(ids, {c.id: c for c in calls})
        if bad:
            raise BadRequest(f"'accepted_call_ids': {bad[0][1]}" + (f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""),
                             param="accepted_call_ids")
    return ids


def _bad_ids(ids: Sequence[str], by_id: Mapping[str, Call]) -> list[tuple[str, str]]:
    """(id, explanation) for each named id that is not a completed call of the rollout."""
    bad: list[tuple[str, str]] = []
    for cid in ids:
        c = by_id.get(cid)
        if c is None:
            bad.append((cid, f"{cid} is not a call of this rollout (send the 'id' of a chat.completion "
                             "this rollout's base_url answered)"))
        elif c.status != "completed":
            bad.append((cid, f"{cid} is a call that did not complete ({c.status}): it sampled nothing "
                             "that can be trained"))
    return bad


def record_accepted_ids(record: Mapping[str, Any] | None) -> list[str]:
    """The record's `accepted_call_ids` ([] when it names none). Malformed entries are skipped
    here; the finish route refuses them before they are stored."""
    if not isinstance(record, Mapping):
        return []
    ids = record.get("accepted_call_ids")
    if not isinstance(ids, list):
        return []
    return list(dict.fromkeys(i for i in ids if isinstance(i, str) and i))


def _is_ancestor(a: Call, b: Call, by_id: Mapping[str, Call]) -> bool:
    """True when `a` is on `b`'s parent chain. Parents always have smaller ordinals."""
    pid = b.parent_id
    while pid is not None:
        if pid == a.id:
            return True
        p = by_id.get(pid)
        if p is None or p.ordinal < a.ordinal:
            return False
        pid = p.parent_id
    return False


def _best_path(steps: list[list[Call]], by_id: Mapping[str, Call], claimed: set[str]) -> list[Call]:
    """Viterbi over candidate calls (see the module docstring for the score)."""
    # score = (-order violations, ancestor links, -calls an earlier conversation claimed, sum of ordinals)
    scores: list[tuple[int, int, int, int]] = [(0, 0, -(c.id in claimed), c.ordinal) for c in steps[0]]
    back: list[list[int]] = [[-1] * len(steps[0])]
    for k in range(1, len(steps)):
        prev, cur = steps[k - 1], steps[k]
        new_scores: list[tuple[int, int, int, int]] = []
        new_back: list[int] = []
        for c in cur:
            best, best_j = None, -1
            for j, p in enumerate(prev):
                s = scores[j]
                cand = (
                    s[0] - (c.ordinal <= p.ordinal),
                    s[1] + _is_ancestor(p, c, by_id),
                    s[2] - (c.id in claimed),
                    s[3] + c.ordinal,
                )
                if best is None or cand > best:
                    best, best_j = cand, j
            assert best is not None
            new_scores.append(best)
            new_back.append(best_j)
        scores = new_scores
        back.append(new_back)
    j = max(range(len(scores)), key=lambda i: scores[i])
    path: list[Call] = []
    for k in range(len(steps) - 1, -1, -1):
        path.append(steps[k][j])
        j = back[k][j]
    path.reverse()
    return path


def select_calls(record: Mapping[str, Any] | None, calls: Sequence[Call]) -> Selection:
    """Match every assistant message of the record to the completed call that produced it."""
    by_hash: dict[str, list[Call]] = {}
    for c in calls:
        if c.status == "completed" and c.response_hash:
            by_hash.setdefault(c.response_hash, []).append(c)
    by_id = {c.id: c for c in calls}
    sel = Selection()
    convs: list[tuple[int, list[int], list[list[Call]]]] = []
    for ci, conv in enumerate(record_conversations(record)):
        positions: list[int] = []
        steps: list[list[Call]] = []
        for mi, msg in enumerate(conv):
            if (type(msg) is not dict and not isinstance(msg, Mapping)) or msg.get("role") != "assistant":
                continue
            cands = by_hash.get(message_hash(msg).hex(), [])
            if not cands:
                sel.matches.append(Match(ci, mi, None, 0))
                continue
            positions.append(mi)
            steps.append(cands)
        if steps:
            convs.append((ci, positions, steps))
    paths: list[list[Call]] = [[s[0] for s in steps] if all(len(s) == 1 for s in steps) else []
                               for _, _, steps in convs]
    open_ = [k for k, p in enumerate(paths) if not p]
    # conversations whose messages have several candidates: each pass picks, per conversation,
    # the path that claims fewest calls the other conversations picked, until no pick changes.
    # The first pass takes the longest conversations first: a long window's turns can only be a
    # chain of as many calls, where a short one fits in many places (taken in record order, two
    # short windows could split the chains a long one needs and leave it none unclaimed)
    first = sorted(open_, key=lambda k: -len(convs[k][2]))
    for k in first:
        others = {c.id for j, p in enumerate(paths) if j != k for c in p}
        paths[k] = _best_path(convs[k][2], by_id, others)
    for _ in range(4 if open_ else 0):
        changed = False
        for k in open_:
            others = {c.id for j, p in enumerate(paths) if j != k for c in p}
            path = _best_path(convs[k][2], by_id, others)
            if path != paths[k]:
                paths[k], changed = path, True
        if not changed:
            break
    for (ci, positions, steps), path in zip(convs, paths, strict=True):
        for mi, c, cands in zip(positions, path, steps, strict=True):
            sel.matches.append(Match(ci, mi, c.id, len(cands)))
            sel.accepted.add(c.id)
    named = record_accepted_ids(record)
    if named:
        _apply_accepted_ids(sel, named, by_id)
    sel.matches.sort(key=lambda m: (m.conversation, m.message))
    return sel


def _apply_accepted_ids(sel: Selection, named: Sequence[str], by_id: Mapping[str, Call]) -> None:
    """Add the named calls to the accepted ones; pair the unmatched messages with the named calls
    no message matched (both in order); record each bad id as a problem (see the module doc)."""
    bad = _bad_ids(named, by_id)
    for _, text in bad:
        sel.problems.append(("unknown_call_id", f"accepted_call_ids: {text}"))
    bad_ids = {cid for cid, _ in bad}
    good = [cid for cid in named if cid not in bad_ids]
    matched = {m.call_id for m in sel.matches if m.call_id is not None}
    unclaimed = sorted((cid for cid in good if cid not in matched), key=lambda i: by_id[i].ordinal)
    sel.accepted.update(good)
    pending = sorted(sel.unmatched, key=lambda m: (m.conversation, m.message))
    for m, cid in zip(pending, unclaimed):
        m.call_id = cid
        m.by = "accepted_id"
