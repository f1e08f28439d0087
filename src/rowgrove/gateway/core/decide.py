"""Root or continuation, decided per call before generation (docs/gateway.md, "The window path").
Pure: no I/O, no clock, no "previous call" state.

    h0 = chain_start(tools, options); h_i = chain_step(h_{i-1}, message_hash(m_i))
    j  = the last assistant message
    continuation  iff  every message after j is user/tool (at least one)
                  and  a completed call of this rollout has summary_hash == hex(h_j)
                       (several, i.e. identical retries: the most recent)
                  and  that parent's sampled ids end with a stop id
                  and  the template's rendering of the whole request locates the end of the
                       parent's turn exactly (`Renderer.continuation`)
    continuation prompt = parent's context (full prompt + sampled) + what the template writes after it
    otherwise a root, rendered in full.

A continuation whose history the template renders differently from what the model saw and
sampled keeps the parent's tokens and is marked `drift` (a history-drift continuation).

The window path (`_window_continuation`): when the parent stored its window facts (`WindowInfo`)
and the template's window proof holds, only the messages from the parent's last request message
on are rendered, and the result is compared with what the parent stored; it gives the very text
the whole rendering gives, so the same ids, at a cost that does not grow with the history. Any
doubt (facts missing or changed, drift) falls back to the whole rendering.

`RolloutIndex` holds one rollout's completed calls (by summary hash, with their token contexts) and
a memo of message hashes, so a call's hashing cost does not grow with the history already hashed:
a message is canonicalized once per rollout; later requests that repeat it only pay a C-speed
`orjson.dumps` and a dict lookup. Contexts are stored as a tree of segments (each call keeps only
what it added to its parent), so memory grows with the rollout's unique tokens, not with
calls x context; the contexts of the few most recent calls are also kept whole for speed.

Rollouts never link because each has its own index. Concurrent calls of one rollout each find
their own parent, since the parent is looked up by the request's own messages.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from rowgrove.engines.base import ExtendedIds
from rowgrove.errors import BadRequest, RowgroveError
from rowgrove.gateway.core.messages import (
    NO_IMAGES,
    Kept,
    RequestImages,
    _check_message,
    response_message,
    validate_messages,
    validate_tools,
)
from rowgrove.hashing import blind_chain, chain_start, chain_step, message_hash
from rowgrove.types import Call

if TYPE_CHECKING:
    from rowgrove.gateway.core.render import Renderer

# Why a call is a root (Decision.reason); a continuation says CONTINUATION.
CONTINUATION = "continuation"
NO_ASSISTANT = "no assistant message"
ENDS_WITH_ASSISTANT = "request ends with an assistant message"
NOT_USER_OR_TOOL = "a system or developer message follows the last assistant message"
REWRITTEN = "rewritten history"
NOT_SPLITTABLE = "template not splittable"  # the new part could not be located exactly
PARENT_NO_EOT = "parent ended without end-of-turn"

RECENT_CONTEXTS = 4  # contexts kept whole per rollout (the rest are rebuilt from segments)
SNAPSHOTS = 2        # recent requests kept as JSON bytes per rollout, for the prefix shortcut


@dataclass
class Decision:
    """What the gateway does with one request.

    `prompt_ids` is what the ledger stores: the full prompt for a root, only the new part for a
    continuation. `full_prompt_ids` is what the engine sees (for a continuation: the parent's exact
    context followed by `prompt_ids`). `request_hash` is hex(h_n); `chain` is [h_1, ..., h_n] as
    bytes. `reason` says why the call is a root (`CONTINUATION` when it is not). `context_text` is
    the text `full_prompt_ids` encode (the parent's context text + the new part, for a
    continuation). `drift`: a continuation whose history the template renders differently from
    the parent's tokens, which were kept.
    """

    parent_id: str | None
    prompt_ids: list[int]
    full_prompt_ids: list[int]
    request_hash: str
    chain: list[bytes]
    reason: str
    context_text: str | None = None
    drift: bool = False
    images: list[Any] = field(default_factory=list)     # the full prompt's images, in order (vision models)
    messages: list[Any] | None = None                   # the request's messages as hashed (file URLs as stored refs)
    window: WindowInfo | None = None                    # what this call's children need for the window path

    @property
    def root(self) -> bool:
        """True for a root (no parent)."""
        return self.parent_id is None


@dataclass(frozen=True)
class WindowInfo:
    """What a call's children need to render only their window (`render.Renderer.fast_window`):
    the raw-prefix identity of its request (`RolloutIndex.last_states[-1]`), the template's text
    before the first message (`pre`) and its loop-body variables (`v`) for that request, `tail`,
    the text the template wrote for the request's last message and the generation prompt, and
    `prompt_len`, the length of the rendered prompt text, which the call's context text starts
    with (only a root or an exact continuation has window facts), and `offset`, the index of the
    message the template's loop starts with (1 for a loop over `messages[1:]`)."""

    state: Any
    pre: str
    v: str
    tail: str
    prompt_len: int
    offset: int


def _window_info(state: Any, split: Any, prompt_len: int, n: int) -> WindowInfo | None:
    if split is None or not split.items:
        return None
    return WindowInfo(state, split.pre, split.v, split.items[-1], prompt_len, n - len(split.items))


def summary_hashes(decision: Decision, response: Mapping[str, Any]) -> tuple[str, str]:
    """(summary_hash, response_hash) of a completed call, as the ledger stores them: the request
    chain extended by the response message, and the response message's own hash (hex)."""
    digest = message_hash(response)
    return chain_step(decision.chain[-1], digest).hex(), digest.hex()



_NO_PIXELS: Mapping[int, str | None] = {}  # a message without resolved images: none of its parts names pixels

class _Node:
    """One completed call in the index: its parent node, what it added (int32), total length."""

    __slots__ = ("call_id", "last", "length", "parent", "segment", "text")

    def __init__(self, call_id: str, parent: _Node | None, segment: np.ndarray, text: str | None = None):
        self.call_id = call_id
        self.parent = parent
        self.segment = segment
        self.text = text  # the text `segment` encodes; None: decoded when first needed
        self.length = (parent.length if parent else 0) + len(segment)
        self.last = int(segment[-1]) if len(segment) else (parent.last if parent else None)


class RolloutIndex:
    """One rollout's completed calls, looked up by summary hash, with their token contexts.

    In memory, rebuildable from the ledger (`from_calls`). Not thread-safe: use it from one event
    loop (each method runs without awaiting).
    """

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._by_summary: dict[str, list[str]] = {}
        self._recent: OrderedDict[str, list[int]] = OrderedDict()
        self._recent_text: OrderedDict[str, str] = OrderedDict()
        self._memo: dict[tuple[Any, bytes], tuple[bytes, int]] = {}
        self._states = itertools.count(1)
        self._snapshots: list[_Snapshot] = []
        self._last: tuple[bytes, Sequence[Any], tuple[bytes, ...], tuple[Any, ...]] | None = None  # the latest `chain`
        # calls whose request carried images: image-blind summary -> call ids, and each one's
        # image places (message, part, pixel digest): the kept-image check
        self._by_blind: dict[str, list[str]] = {}
        self._images: dict[str, list[tuple[int, int, str]]] = {}
        # the window path (render.Renderer.fast_window): each call's window facts, and the
        # prepared messages of recent requests by the identity of their raw prefix
        self._windows: dict[str, WindowInfo] = {}
        self._prepared: OrderedDict[Any, list[dict[str, Any]]] = OrderedDict()
        self.last_states: list[Any] = []  # the raw-prefix identity after each message of the latest `chain`

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._nodes

    # -- adding calls ---------------------------------------------------------------------------

    def add_call(self, call_id: str, summary_hash: str, context_ids: np.ndarray | Sequence[int], *,
                 sampled_ids: Sequence[int] | None = None, parent_id: str | None = None,
                 context_text: str | None = None, window: WindowInfo | None = None) -> None:
        """Record a completed call: `context_ids` = its full prompt + its sampled ids (or, with
        `sampled_ids`, its full prompt alone: the two are kept side by side and joined only when a
        child extends them, so a long context is copied once per call, not twice), and
        `context_text` the exact text they encode (the rendered prompt + the sampled ids decoded;
        decoded from the ids when first needed if not given).

        With `parent_id` (the decision's parent, already in the index) only what the call added
        after the parent's context is stored; the parent's context must be a prefix of
        `context_ids` (spot-checked at both ends; a context that fails the check is stored
        whole). A list is kept as given (the recent-context cache shares it): do not mutate it."""
        if call_id in self._nodes:
            raise RowgroveError(f"call {call_id} is already in the rollout index: add each call once")
        ctx: Any = context_ids.tolist() if isinstance(context_ids, np.ndarray) else context_ids
        if not isinstance(ctx, list | ExtendedIds):
            ctx = list(ctx)
        if sampled_ids is not None:
            ctx = _Joined(ctx, list(sampled_ids))
        parent = self._nodes.get(parent_id) if parent_id is not None else None
        if parent is not None and not self._extends(ctx, parent):
            parent = None
        start = parent.length if parent is not None else 0
        text = None
        if context_text is not None:
            if parent is None:
                text = context_text
            else:
                parent_text = self._recent_text.get(parent.call_id)
                if parent_text is not None and context_text.startswith(parent_text):
                    text = context_text[len(parent_text):]
        self._insert(_Node(call_id, parent, np.asarray(ctx[start:], dtype=np.int32), text), summary_hash, ctx)
        if context_text is not None:
            self._remember_text(call_id, context_text)
        if window is not None and context_text is not None:
            self._windows[call_id] = window

    def window(self, call_id: str) -> WindowInfo | None:
        """The window facts of completed call `call_id` (None: its children render in full)."""
        return self._windows.get(call_id)

    def prepared(self, messages: Sequence[Any], renderer: Renderer,
                 images: RequestImages = NO_IMAGES) -> list[dict[str, Any]]:
        """`renderer.prepare(messages)` of the messages the latest `chain` hashed, reusing the
        prepared prefix of a recent request whose raw messages this one starts with."""
        states = self.last_states
        n = len(messages)
        if len(states) != n:  # `chain` was not this index's (a subclass that hashes on its own)
            return renderer.prepare(messages, images=images)
        k = n - 1
        while k >= 0 and n - k <= 8 and states[k] not in self._prepared:
            k -= 1
        if k >= 0 and states[k] in self._prepared:
            head = self._prepared[states[k]]
            out = head + renderer.prepare(messages[k + 1:], k + 1, images=images)
        else:
            out = renderer.prepare(messages, images=images)
        if n:
            self._prepared[states[-1]] = out
            self._prepared.move_to_end(states[-1])
            while len(self._prepared) > RECENT_CONTEXTS:
                self._prepared.popitem(last=False)
        return out

    def add_images(self, call_id: str, blind_summary: str, places: Sequence[tuple[int, int, str]]) -> None:
        """Record the image-blind summary and image places of completed call `call_id` (a call
        whose request carried images), for `check_kept_images`."""
        self._by_blind.setdefault(blind_summary, []).append(call_id)
        self._images[call_id] = list(places)

    def check_kept_images(self, messages: Sequence[Any], j: int, h0: bytes, images: RequestImages) -> None:
        """BadRequest (code `image_changed`) when `messages[:j+1]` is the conversation of a call of
        this rollout in everything but the pixels of an image that call saw in `messages[:j]`, the
        first such image named; `images`: the request's images as the edge resolved them."""
        if not self._by_blind:
            return
        found = self._by_blind.get(blind_chain(messages[: j + 1], h0).hex())
        if not found:
            return
        parent_id = found[-1]
        now = images.digests
        for i, k, digest in self._images.get(parent_id, ()):
            if (now.get((i, k)) if i < j else None) != digest:
                raise BadRequest(
                    f"messages[{i}].content[{k}]: this image's pixels differ from those call {parent_id} saw at this "
                    "place in the conversation, which this request otherwise continues: send the kept image "
                    "unchanged (re-encoding the same pixels is fine), or drop old images to start a new root",
                    param="messages", code="image_changed")

    def _extends(self, ctx: list[int] | _Joined, parent: _Node) -> bool:
        """Whether `ctx` can start with `parent`'s context: long enough, and equal to it at both
        ends of the parent's span when that context is at hand (a spot check, O(1))."""
        n = parent.length
        if len(ctx) < n:
            return False
        held = self._recent.get(parent.call_id)
        if held is None:
            return ctx[n - 1] == parent.last if n else True
        w = min(n, 64)
        return ctx[:w] == held[:w] and ctx[n - w:n] == held[n - w:n]

    def add_completed(self, call: Call) -> None:
        """Record a completed `Call` from the ledger: context = its parent's context (a
        continuation) + `call.prompt_ids` + `call.sampled_ids`. A continuation whose parent is not
        in the index, or a call that is not completed or has no summary, is left out (it then
        cannot be a parent: a request extending it becomes a root)."""
        if call.status != "completed" or not call.summary_hash or call.id in self._nodes:
            return
        parent = None
        if not call.root:
            parent = self._nodes.get(call.parent_id) if call.parent_id is not None else None
            if parent is None:
                return
        segment = np.concatenate([np.asarray(call.prompt_ids, np.int32), np.asarray(call.sampled_ids, np.int32)])
        self._insert(_Node(call.id, parent, segment), call.summary_hash, None)

    def _insert(self, node: _Node, summary_hash: str, ctx: list[int] | _Joined | None) -> None:
        self._nodes[node.call_id] = node
        self._by_summary.setdefault(summary_hash, []).append(node.call_id)
        if ctx is not None:
            self._remember(node.call_id, ctx)

    def _remember_text(self, call_id: str, text: str) -> None:
        self._recent_text[call_id] = text
        self._recent_text.move_to_end(call_id)
        while len(self._recent_text) > RECENT_CONTEXTS:
            self._recent_text.popitem(last=False)

    def context_text(self, call_id: str, decode: Any) -> str:
        """The call's full context as text; `decode(ids)` turns a stored segment whose text was
        not given back into text (special tokens kept)."""
        held = self._recent_text.get(call_id)
        if held is not None:
            self._recent_text.move_to_end(call_id)
            return held
        node: _Node | None = self._node(call_id)
        parts: list[str] = []
        while node is not None:
            held = self._recent_text.get(node.call_id)
            if held is not None:
                parts.append(held)
                break
            if node.text is None:
                node.text = decode(node.segment.tolist())
            parts.append(node.text)
            node = node.parent
        text = "".join(reversed(parts))
        self._remember_text(call_id, text)
        return text

    def _remember(self, call_id: str, ctx: list[int] | _Joined) -> None:
        self._recent[call_id] = ctx
        self._recent.move_to_end(call_id)
        while len(self._recent) > RECENT_CONTEXTS:
            self._recent.popitem(last=False)

    @classmethod
    def from_calls(cls, calls: Iterable[Call]) -> RolloutIndex:
        """The index of one rollout rebuilt from its ledger calls (after a restart): completed
        calls only, in ordinal order, each continuation's context rebuilt through its parents."""
        index = cls()
        for call in sorted(calls, key=lambda c: c.ordinal):
            index.add_completed(call)
        return index

    # -- lookups --------------------------------------------------------------------------------

    def candidates(self, summary_hash: str) -> list[str]:
        """Ids of the completed calls whose summary is `summary_hash`, most recent last."""
        return list(self._by_summary.get(summary_hash, ()))

    def last_token(self, call_id: str) -> int | None:
        """The last id of the call's context (its last sampled id, if it sampled any)."""
        return self._node(call_id).last

    def context(self, call_id: str) -> np.ndarray:
        """The call's full context (prompt + sampled ids) as int32."""
        return np.asarray(self.context_list(call_id), dtype=np.int32)

    def context_list(self, call_id: str) -> list[int]:
        """The call's full context as a list (shared: do not mutate it)."""
        held = self._recent.get(call_id)
        if held is not None:
            self._recent.move_to_end(call_id)
            if isinstance(held, _Joined):
                held = self._recent[call_id] = held.joined()
            return held
        node: _Node | None = self._node(call_id)
        parts = []
        while node is not None:
            held = self._recent.get(node.call_id)
            if held is not None:
                parts.append(held.joined() if isinstance(held, _Joined) else held)
                break
            parts.append(node.segment.tolist())
            node = node.parent
        if len(parts) == 1:
            ctx = parts[0] if isinstance(parts[0], list) else list(parts[0])
        else:
            ctx = []
            for part in reversed(parts):
                ctx.extend(part)
        self._remember(call_id, ctx)
        return ctx

    def extended(self, call_id: str, ids: list[int]) -> list[int]:
        """A new list: the call's full context followed by `ids` (a child's full prompt), with one
        copy of the context, whether it is held whole or as prompt and sampled ids side by side."""
        held = self._recent.get(call_id)
        if not isinstance(held, _Joined):
            return self.context_list(call_id) + ids
        self._recent.move_to_end(call_id)
        # the prompt as an extension of the parent's prompt list: an engine that checked that
        # list last checks only what follows it (`engines.base.ExtendedIds`)
        return ExtendedIds(held.head, held.tail, ids)

    def _node(self, call_id: str) -> _Node:
        try:
            return self._nodes[call_id]
        except KeyError:
            raise KeyError(f"call {call_id} is not a completed call of this rollout's index") from None

    # -- hashing --------------------------------------------------------------------------------

    def chain(self, messages: Sequence[Any], h0: bytes, images: RequestImages = NO_IMAGES) -> list[bytes]:
        """[h_1, ..., h_n] for `messages` after `h0`, validating each message (BadRequest as
        `validate_messages` raises) unless this rollout already saw the same raw prefix. An image
        part is hashed by the pixel digest the edge resolved for it (`images`), never read here.

        Two memos, both keyed by exact raw JSON bytes (tool-call ids included), so a hit means the
        messages were hashed and validated before in the very same context:
        - a recent request whose messages the new one starts with (compared as bytes of the whole
          list: one C-speed dumps and a memcmp, no per-message Python work for the prefix);
        - per message, keyed by (raw prefix identity, the message's bytes), for branches and
          retries that share a prefix with an older request.
        Only the remaining new messages are canonicalized and checked. Messages the edge decoded
        as the very objects of this index's previous request (`messages.Kept`) reuse its hashes
        without even that dumps."""
        memo = self._memo
        out: list[bytes] = []
        states: list[Any] = []
        h = h0
        state: Any = h0  # identity of the raw prefix so far
        start = 0
        blob: bytes | None = None
        if self._last is not None and type(messages) is Kept:
            last_h0, last_messages, last_chain, last_states = self._last
            if messages.source is last_messages and last_h0 == h0:
                start = min(messages.kept, len(last_chain), len(messages))
        if start:
            out, states = list(last_chain[:start]), list(last_states[:start])
            h, state = out[-1], states[-1]
        else:
            try:
                blob = orjson.dumps(messages)
            except (orjson.JSONEncodeError, TypeError):
                blob = None
        if blob is not None:
            for snap in self._snapshots:
                if snap.h0 == h0 and start < snap.n <= len(messages) and (
                        blob == snap.blob if snap.n == len(messages) else blob.startswith(snap.opened)):
                    start, out, state = snap.n, list(snap.chain), snap.state
                    states = list(snap.states)
                    h = out[-1]
        for i in range(start, len(messages)):
            m = messages[i]
            try:
                key: tuple[Any, bytes] | None = (state, orjson.dumps(m))
            except (orjson.JSONEncodeError, TypeError):
                key = None
            hit = memo.get(key) if key is not None else None
            if hit is None:
                _check_message(messages, i)
                h = chain_step(h, message_hash(m, images.by_message.get(i, _NO_PIXELS)))
                state = next(self._states)
                if key is not None:
                    memo[key] = (h, state)
            else:
                h, state = hit
            out.append(h)
            states.append(state)
        self.last_states = states
        self._last = (h0, messages, tuple(out), tuple(states))
        if blob is not None and start < len(messages):
            self._snapshots.insert(0, _Snapshot(h0, blob, len(messages), tuple(out), tuple(states)))
            del self._snapshots[SNAPSHOTS:]
        return out


class _Joined:
    """A call's context held as its prompt and its sampled ids side by side (`add_call` with
    `sampled_ids`); read like the list they make (`len`, an index, a slice), joined on demand."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[int], tail: list[int]):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __getitem__(self, k: Any) -> Any:
        n = len(self.head)
        if isinstance(k, slice):
            a, b, step = k.indices(len(self))
            if step != 1:
                return self.joined()[k]
            if b <= n:
                return self.head[a:b]
            return self.head[a:b] + self.tail[max(a - n, 0):b - n]
        if k < 0:
            k += len(self)
        return self.head[k] if k < n else self.tail[k - n]

    def joined(self) -> list[int]:
        return self.head + self.tail


class _Snapshot:
    """A recent request of the rollout as JSON bytes, with its chain: a later request whose bytes
    start with these messages (the usual case: the previous request + the reply + new messages)
    reuses the chain after one C-speed `orjson.dumps` and a byte comparison."""

    __slots__ = ("blob", "chain", "h0", "n", "opened", "state", "states")

    def __init__(self, h0: bytes, blob: bytes, n: int, chain: tuple[bytes, ...], states: tuple[Any, ...]):
        self.h0, self.blob, self.n, self.chain, self.states = h0, blob, n, chain, states
        self.state = states[-1]
        self.opened = blob[:-1] + b","  # "[m1,...,mn," : what a longer request starts with


# -- the decision ----------------------------------------------------------------------------------


def check_request(messages: Any, tools: Sequence[Any] | None, options: Any) -> None:
    """The request-level checks `decide` makes first (BadRequest): a non-empty list of messages,
    valid tools (param "tools"), template kwargs that are an object. The edge makes them before it
    resolves a request's images, so errors come in the same order with images as without."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of message objects", param="messages")
    validate_tools(tools)
    if options is not None and not isinstance(options, Mapping):
        raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")


def decide(index: RolloutIndex, messages: list[dict[str, Any]], renderer: Renderer, *,
           tools: Sequence[Any] | None = None, options: Mapping[str, Any] | None = None,
           images: RequestImages = NO_IMAGES) -> Decision:
    """Root or continuation for one request of the rollout whose index is `index`.

    Validates the messages (BadRequest, param "messages") the first time the rollout sees each one,
    and the tools (param "tools"). For a vision model, `messages` and `images` are what the edge
    made of the request (`gateway.images.load_request_images`: file URLs as stored references, each
    image part's pixel digest); `decide` reads the images only from `images`. Does not change the
    index: add the call with `index.add_call(...)` once it has completed.
    """
    check_request(messages, tools, options)
    h0 = chain_start(tools, options)
    index.last_states = []
    chain = index.chain(messages, h0, images)
    states = index.last_states if len(index.last_states) == len(messages) else [object()] * len(messages)
    request_hash = chain[-1].hex()
    prepared = index.prepared(messages, renderer, images) if renderer.fast is not None else None

    def root(reason: str) -> Decision:
        r = renderer.root(messages, tools, options, prepared=prepared, images=images)
        window = _window_info(states[-1], renderer.last_split, len(r.text), len(messages)) if prepared is not None else None
        return Decision(None, r.ids, r.ids, request_hash, chain, reason, context_text=r.text,
                        images=images.images, messages=messages, window=window)

    j = len(messages) - 1
    while j >= 0 and messages[j].get("role") != "assistant":
        j -= 1
    if j < 0:
        return root(NO_ASSISTANT)
    tail = messages[j + 1:]
    if not tail:
        return root(ENDS_WITH_ASSISTANT)
    if any(m.get("role") not in ("user", "tool") for m in tail):
        return root(NOT_USER_OR_TOOL)
    found = index.candidates(chain[j].hex())
    if not found:
        if images.images:
            index.check_kept_images(messages, j, h0, images)  # 400 when only a kept image's pixels changed
        return root(REWRITTEN)
    parent = found[-1]
    last = index.last_token(parent)
    if last is None or last not in renderer.stop_ids:
        return root(PARENT_NO_EOT)
    parent_text = index.context_text(parent, renderer.decode)
    if prepared is not None:
        fast = _window_continuation(index, parent, parent_text, last, j, prepared, states, renderer, tools, options)
        if fast is not None:
            ids, rest, window = fast
            return Decision(parent, ids, index.extended(parent, ids), request_hash, chain, CONTINUATION,
                            context_text=parent_text + rest, images=images.images, messages=messages, window=window)
    new = renderer.continuation(messages, j, parent_text, last, tools, options, prepared=prepared, images=images)
    if new is None:
        return root(NOT_SPLITTABLE)
    window = None
    if prepared is not None and not new.drift:
        window = _window_info(states[-1], renderer.last_split, len(parent_text) + len(new.text),
                              len(messages))
    return Decision(parent, new.ids, index.extended(parent, list(new.ids)), request_hash, chain, CONTINUATION,
                    context_text=parent_text + new.text, drift=new.drift, images=images.images, messages=messages,
                    window=window)


def _window_continuation(index: RolloutIndex, parent: str, parent_text: str, last: int, j: int,
                         prepared: list[dict[str, Any]], states: list[Any], renderer: Renderer,
                         tools: Sequence[Any] | None, options: Mapping[str, Any] | None
                         ) -> tuple[list[int], str, WindowInfo] | None:
    """(new ids, their text, the call's window facts) of an exact continuation found by rendering
    only the window from the parent's last request message, or None (the caller renders in full).

    With T the whole rendering and X the text before the parent request's last message, the
    window proof (`rowgrove.gateway.core.incremental`) gives T = X + window and, for the parent,
    T_p = X + tail_p when the parent's request is byte-for-byte this request's first j messages
    and the template's `pre` and loop variables `v` are unchanged. The parent's context is
    T_p + sampled, so T starts with it exactly when the window starts with tail_p + sampled, and
    the new part is the rest of the window: the same text, and so the same ids, as the whole
    rendering gives."""
    info = index.window(parent)
    if info is None or j < 1 or states[j - 1] != info.state:
        return None
    split = renderer.fast_window(prepared, tools, options, j - 1, info.offset)
    if split is None or split.pre != info.pre or split.v != info.v:
        return None
    sampled = parent_text[info.prompt_len:]
    window = "".join(split.items)
    cut = len(info.tail) + len(sampled)
    if not (window.startswith(info.tail) and window.startswith(sampled, len(info.tail)) and len(window) > cut):
        return None
    rest = window[cut:]
    ids = renderer._after(last, rest)
    if ids is None:
        return None
    return ids, rest, WindowInfo(states[-1], info.pre, info.v, split.items[-1], len(parent_text) + len(rest),
                                 info.offset)


__all__ = ["Decision", "RequestImages", "RolloutIndex", "WindowInfo", "check_request", "decide", "response_message",
           "summary_hashes", "validate_messages", "validate_tools"]
