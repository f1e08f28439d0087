"""Chat-template rendering for the gateway: a root prompt in full, and the part a continuation adds
after its parent's sampled tokens, taken from the template's rendering of the whole new request.

What "exact" means. A root's prompt is `apply_chat_template` of the request's messages prepared as
the engine's own chat endpoint prepares them (`rowgrove.gateway.core.preprocess`). A continuation's
prompt is the parent's exact context (its prompt ids + the ids it sampled, ending with a stop
token) followed by what the template writes after that turn in the rendering of the whole new
request:

    T = template(prepared(messages), add_generation_prompt=True)
    P = the parent's context as text (its prompt text + its sampled ids decoded)

    exact:  T starts with P           new part = T[len(P):]
    drift:  otherwise                 the template renders the history differently from what
                                      the model saw and sampled (Qwen3 strips earlier <think>,
                                      gpt-oss ends a past turn with <|end|> where the model
                                      sampled <|return|>, a harness re-sent tool-call arguments
                                      in another key order, ...). The parent's tokens are kept
                                      and the call is counted as a history-drift continuation.
                                      The boundary b (end of the parent's turn in T) is found by
                                      rendering once more with one character of the first new
                                      message changed: b is the end of the last turn-end marker
                                      before the first difference, and the difference must sit
                                      exactly at the changed character (so nothing before it
                                      depends on the new messages' text). Otherwise: a root.

The new part is tokenized on its own, after the end-of-turn token that precedes it: an added
token cuts the text, so `tokenize(T)` continues after it exactly as `tokenize(eot + rest)` does.
Nothing renders a template-dependent "probe": whatever the template does with the history (a
DeepSeek-R1 template that opens its tool-outputs block once per conversation, a Ministral template
that checks role alternation, a Mistral template that demands 9-character tool-call ids), the new
part is what the template itself writes for this request.

Cost: where the template's window proof holds (`core.incremental`), a continuation renders only
its window with MiniJinja (`core.window`; `decide._window_continuation`), and the text it adds is
the same as the whole rendering's. Otherwise one template render of the request (two on drift),
one string comparison with the parent's text, and tokenization of the new part only. A whole
rendering goes through MiniJinja, or through the compiled jinja2 template (the same variables as
`apply_chat_template`), once either matched `apply_chat_template` for a (tools, options); a
continuation never tokenizes the history, and a root tokenizes each piece of text between added
tokens once per renderer (`encode_prompt`).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rowgrove.errors import BadRequest, InputError
from rowgrove.gateway.core.drift import change_one_char, common_prefix
from rowgrove.gateway.core.messages import NO_IMAGES, RequestImages
from rowgrove.gateway.core.pieces import lines_cut_exactly, units_of
from rowgrove.gateway.core.preprocess import detect_part_roles, engine_message, prepared_images, renders_developer

# apply_chat_template's own parameters, and the variables it fills from the tokenizer: a
# chat_template_kwargs key with one of these names would change how rendering works (or which
# special tokens the template writes) rather than pass a template variable.
_RESERVED_OPTIONS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens",
    "messages", "raise_exception", "strftime_now", "namespace", "dict",
    "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens", "extra_special_tokens",
})

_ODD_JSON = re.compile(rb"\\u001[c-fC-F]")  # window.plain's characters, escaped in JSON
_PREPARED_CACHE = 65536  # prepared messages kept per renderer, by their raw JSON
_PIECE_CACHE = 16384     # tokenized text pieces (between added tokens) kept per renderer
_BATCH_CHARS = 32768     # text to tokenize above which the pieces go as one (threaded) batch


@dataclass(frozen=True)
class Rendered:
    """A prompt: its ids and the exact text they encode."""

    ids: list[int]
    text: str


@dataclass(frozen=True)
class Continuation:
    """What a continuation adds after its parent's context: ids, their text, and whether the
    template renders the parent's history differently from what the model saw (`drift`)."""

    ids: list[int]
    text: str
    drift: bool


class Renderer:
    """Renders requests with a tokenizer's chat template into prompt token ids.

    `tokenizer` is a transformers fast tokenizer with a `chat_template`; `stop_ids` are the ids
    that end a model turn (`rowgrove.model.load.stop_token_ids`; found from the tokenizer's folder
    when not given). Template variables (`options`, the request's `chat_template_kwargs` such as
    `{"enable_thinking": False}`) and `tools` are passed to the template as `apply_chat_template`
    passes them; tools keep the key order the client sent, which is the order templates render.
    """

    def __init__(self, tokenizer: Any, *, stop_ids: Sequence[int] | None = None, vision: Any = None):
        if not getattr(tokenizer, "chat_template", None) or not isinstance(tokenizer.chat_template, str):
            raise InputError("the tokenizer has no chat template: load one that ships chat_template.jinja")
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        self._template = _compiled_template(tokenizer)
        self._special = dict(tokenizer.special_tokens_map)
        # the fast path (rowgrove.gateway.core.window): MiniJinja over the template's window form,
        # trusted per (tools, options) once it matched apply_chat_template
        from rowgrove.gateway.core.window import fast_engine

        self.fast, self.fast_declined = fast_engine(tokenizer.chat_template, self._special) \
            if vision is None else (None, "a vision model (images are expanded after rendering)")
        self._fast_verified: dict[bytes, bool] = {}
        self._plain_tools: dict[bytes, bool] = {}  # window.plain(tools) by _options_key (tools as sent)
        self.last_split: Any = None  # the window split of the latest full render (window.Split) or None
        # the roles whose text parts reach the template as a list (`preprocess.detect_part_roles`)
        self.content_format: frozenset[str] = detect_part_roles(tokenizer.chat_template)
        # a developer message reaches a template that does not render the role as a system message
        self.developer: bool = renders_developer(tokenizer.chat_template)
        self._fast_ok: dict[bytes, bool] = {}
        self._prepared: OrderedDict[bytes, dict[str, Any]] = OrderedDict()
        # whether each prepared message in that cache is `window.plain`, by the object's id (valid
        # while the cache holds the object: an entry leaves with it)
        self._plain: dict[int, bool] = {}
        if stop_ids is None:
            from rowgrove.model.load import stop_token_ids

            stop_ids = stop_token_ids(tokenizer)
        self.stop_ids: frozenset[int] = frozenset(int(i) for i in stop_ids)
        from rowgrove.model.load import end_of_turn_id

        self.end_of_turn_id: int = end_of_turn_id(tokenizer)
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._added_text = {int(i): t.content for i, t in added.items()}
        self._special_text = {int(i): t.content for i, t in added.items() if t.special}
        self._markers: tuple[str, ...] | None = None
        # root prompts tokenized piece by piece between added tokens (`encode_prompt`)
        plain_added = all(not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values())
        self._pieces_ok: bool | None = None if plain_added and self._added_text else False
        self._pieces: OrderedDict[tuple[int | None, str], list[int]] = OrderedDict()
        # and within a piece line by line, where that provably tokenizes the same (core.pieces)
        self._lines_ok = self._backend is not None and lines_cut_exactly(self._backend)
        # byte-level decoding (`decode_reply`): the text of ids followed by an added token is the
        # text of the ids, then the token's own text
        self._bytes_decoded = self._backend is not None and type(self._backend.decoder).__name__ == "ByteLevel"
        self._added_id = {t: i for i, t in sorted(self._added_text.items(), reverse=True)}
        self._added_re = re.compile("|".join(re.escape(t) for t in sorted(self._added_id, key=len, reverse=True))) \
            if self._added_id else None
        self._closing: bool | None = None
        # a vision model (`rowgrove.model.vision.Vision`): image parts are kept for the template
        # and each image placeholder it writes is expanded as the model's processor expands it
        self.vision = vision

    # -- rendering ------------------------------------------------------------------------------

    def prepare(self, messages: Sequence[Mapping[str, Any]], start: int = 0, *,
                images: RequestImages = NO_IMAGES) -> list[dict[str, Any]]:
        """The messages as the engine's chat endpoint hands them to the template
        (`preprocess.engine_message`), memoized by each message's raw JSON (an image part's URL
        names one pixel digest, so a memo hit holds the digest the edge resolved). `start`: the
        index of `messages[0]` in its request. `images`: the request's images as the edge
        resolved them (a vision model)."""
        out = []
        cache = self._prepared
        media = self.vision is not None
        for i, m in enumerate(messages, start):
            try:
                key = orjson.dumps(m)
            except (orjson.JSONEncodeError, TypeError):
                out.append(engine_message(m, i, self.content_format, media=media, images=images, developer=self.developer))
                continue
            hit = cache.get(key)
            if hit is None:
                hit = engine_message(m, i, self.content_format, media=media, images=images, developer=self.developer)
                cache[key] = hit
                if self.fast is not None:
                    # window.plain(hit) read off the message's JSON: JSON escapes U+001C..U+001F
                    # as \u001c.. (orjson in lower case), and every string of the prepared
                    # message is one of the message's or decoded from one (tool-call arguments),
                    # whose escapes then show as \\u001c, matched too; walking the prepared
                    # dicts cost ~3% of a call's CPU at 32 concurrent rollouts
                    self._plain[id(hit)] = _ODD_JSON.search(key) is None
                if len(cache) > _PREPARED_CACHE:
                    self._plain.pop(id(cache.popitem(last=False)[1]), None)
            out.append(hit)
        return out

    def _tools_plain(self, key: bytes, tools: Any) -> bool:
        """`window.plain(tools)`, remembered by the (tools, options) key the fast path's verdict is
        kept by (the tools exactly as sent): a rollout sends the same tools every call, and walking
        their JSON schemas cost about 12 us a call (two tools)."""
        ok = self._plain_tools.get(key)
        if ok is None:
            from rowgrove.gateway.core.window import plain

            if len(self._plain_tools) >= 1024:
                self._plain_tools.clear()
            ok = self._plain_tools[key] = plain(tools)
        return ok

    def _all_plain(self, prepared: Sequence[Mapping[str, Any]]) -> bool:
        """`window.plain` of every message, as remembered for the messages `prepare` caches."""
        from rowgrove.gateway.core.window import plain

        known = self._plain
        for m in prepared:
            ok = known.get(id(m))
            if ok is None:
                ok = plain(m)
            if not ok:
                return False
        return True

    def render_text(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
                    options: Mapping[str, Any] | None = None, *, add_generation_prompt: bool = True,
                    images: RequestImages = NO_IMAGES) -> str:
        """The template's text for `messages` (prepared as the engine would). BadRequest when the
        template refuses them, naming the template's own message, or when an option clashes with
        a renderer parameter."""
        return self._render(self.prepare(messages, images=images), tools, options, add_generation_prompt, images)

    def render_root(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
                    options: Mapping[str, Any] | None = None) -> list[int]:
        """The full prompt ids of `messages` with the generation prompt (add_special_tokens=False:
        whatever BOS the template writes is the only one)."""
        return self.root(messages, tools, options).ids

    def root(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
             options: Mapping[str, Any] | None = None, *, prepared: list[dict[str, Any]] | None = None,
             images: RequestImages = NO_IMAGES) -> Rendered:
        """`render_root` with the text the ids encode. `prepared`: `prepare(messages)`, when the
        caller has it; `images`: the request's images as the edge resolved them."""
        if prepared is None:
            prepared = self.prepare(messages, images=images)
        text = self._render(prepared, tools, options, True, images)
        return Rendered(self.encode_prompt(text), text)

    def continuation(self, messages: Sequence[Mapping[str, Any]], j: int, parent_text: str, parent_last: int,
                     tools: Sequence[Any] | None = None, options: Mapping[str, Any] | None = None, *,
                     prepared: list[dict[str, Any]] | None = None,
                     images: RequestImages = NO_IMAGES) -> Continuation | None:
        """What follows the parent's context when `messages[j]` is the parent's response and
        `messages[j+1:]` are new user/tool messages (see the module docstring). `parent_text` is
        the parent's context as text, `parent_last` its last (stop) token id. None when the new
        part cannot be determined exactly: the caller renders a root."""
        if parent_last not in self._added_text:
            return None
        if prepared is None:
            prepared = self.prepare(messages, images=images)
        text = self._render(prepared, tools, options, True, images)
        if text.startswith(parent_text) and len(text) > len(parent_text):
            rest = text[len(parent_text):]
            ids = self._after(parent_last, rest)
            return None if ids is None else Continuation(ids, rest, False)
        whole = self.last_split  # the split of the request's own rendering, not of the probes below
        at = self._drift_boundary(prepared, j, text, tools, options, parent_last, images)
        self.last_split = whole
        if at is None:
            return None
        marker_id, b = at
        rest = text[b:]
        ids = self._after(marker_id, rest)
        return None if ids is None else Continuation(ids, rest, True)

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of `ids`: special tokens kept, no clean-up of spaces."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def decode_reply(self, ids: Sequence[int], body: int) -> tuple[str, str]:
        """(the exact text of `ids`, that of `ids[:body]`): a reply with and without its final stop
        token, decoded once where that gives the same texts. A byte-level decoder turns each id
        into its bytes and the whole into text, so the text before an added token is the text of
        the ids before it, unless they end inside a character (then decoded apart); other decoders
        may join or strip around the token, so both are decoded."""
        full = self.decode(ids)
        if body == len(ids):
            return full, full
        if self._bytes_decoded and body == len(ids) - 1:
            marker = self._added_text.get(int(ids[-1]))
            if marker and full.endswith(marker):
                head = full[:len(full) - len(marker)]
                if not head.endswith("\ufffd"):
                    return full, head
        return full, self.decode(ids[:body])

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_prompt(self, text: str) -> list[int]:
        """`encode(text)`, with the text between added tokens tokenized once per renderer.

        An added token cuts the text (the tokenizer splits on added tokens before anything else),
        so each piece after an added token M tokenizes as `encode(M + piece)` without M's id, the
        form `_after` uses for a continuation; pieces repeat across a rollout's roots (the system
        prompt, tools, every kept message), so each is tokenized once. Used only for a tokenizer
        whose added tokens strip nothing and match raw text, and checked once against `encode` of
        the whole text: a mismatch turns it off for this renderer."""
        if self._pieces_ok is False or self._backend is None or not text:
            return self.encode(text)
        cache = self._pieces
        pieces: list[tuple[int | None, str] | int] = []  # (previous added id, text) or an added id
        prev: int | None = None
        at = 0
        for m in self._added_re.finditer(text):
            if m.start() > at:
                pieces.append((prev, text[at:m.start()]))
            prev = self._added_id[m.group(0)]
            pieces.append(prev)
            at = m.end()
        if at < len(text):
            pieces.append((prev, text[at:]))
        missing = list(dict.fromkeys(p for p in pieces if isinstance(p, tuple) and p not in cache))
        if missing:
            # a new piece is tokenized by its lines where that is exact (core.pieces), so lines
            # repeated across pieces (a file read twice, the same tool output) are tokenized once
            units = units_of(missing, self._lines_ok, cache)
            got = self._tokenize(list(dict.fromkeys(u for us in units.values() for u in us if u not in cache)))
            if got is None:
                self._pieces_ok = False
                return self.encode(text)
            for p, us in units.items():
                cache[p] = [i for u in us for i in (got[u] if u in got else cache[u])]
            cache.update(got)
            while len(cache) > _PIECE_CACHE:
                cache.popitem(last=False)
        out: list[int] = []
        for p in pieces:
            if isinstance(p, int):
                out.append(p)
            else:
                ids = cache.get(p)
                if ids is None:  # evicted while filling (a prompt of more pieces than the cache holds)
                    return self.encode(text)
                out.extend(ids)
        if self._pieces_ok is None:
            self._pieces_ok = out == self.encode(text)
            if not self._pieces_ok:
                return self.encode(text)
        return out

    def _tokenize(self, keys: list[tuple[int | None, str]]) -> dict[tuple[int | None, str], list[int]] | None:
        """{(added id before it, text): its ids}, each text tokenized after its added token
        without that token's id; None when an added token does not come back as its own id."""
        texts = [(self._added_text[p] if p is not None else "") + t for p, t in keys]
        # a large prompt is tokenized as one batch, which the tokenizer spreads over its threads,
        # without the character offsets nothing here reads (encode_batch_fast: the same ids,
        # about 15% less work); a small one is not worth waking the threads
        if sum(map(len, texts)) > _BATCH_CHARS:
            batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
            encoded = [e.ids for e in batch(texts, add_special_tokens=False)]
        else:
            encoded = [self._backend.encode(t, add_special_tokens=False).ids for t in texts]
        out = {}
        for (p, t), ids in zip(keys, encoded, strict=True):
            if p is not None:
                if not ids or ids[0] != p:
                    return None
                ids = ids[1:]
            out[(p, t)] = ids
        return out

    # -- internals ------------------------------------------------------------------------------

    def _render(self, prepared: list[dict[str, Any]], tools: Sequence[Any] | None,
                options: Mapping[str, Any] | None, add_generation_prompt: bool,
                images: RequestImages = NO_IMAGES) -> str:
        text = self._render_template(prepared, tools, options, add_generation_prompt)
        if self.vision is not None:
            text = self.vision.expand(text, prepared_images(prepared, images))
        return text

    def _render_template(self, prepared: list[dict[str, Any]], tools: Sequence[Any] | None,
                         options: Mapping[str, Any] | None, add_generation_prompt: bool) -> str:
        opts = dict(options or {})
        clash = sorted(_RESERVED_OPTIONS.intersection(opts))
        if clash:
            raise BadRequest(
                f"chat_template_kwargs may not set {', '.join(clash)}: these are rendering parameters "
                "or the tokenizer's own special tokens, not template variables; remove them",
                param="chat_template_kwargs")
        tool_list = list(tools) if tools else None
        self.last_split = None
        if self.fast is not None:
            text = self._fast_full(prepared, tool_list, opts, add_generation_prompt)
            if text is not None:
                return text
        try:
            key = _options_key(tool_list, opts) if self._template is not None else b""
            ok = self._fast_ok.get(key) if self._template is not None else False
            if ok:
                return self._direct(prepared, tool_list, opts, add_generation_prompt)
            text = self.tokenizer.apply_chat_template(
                prepared, tools=tool_list, add_generation_prompt=add_generation_prompt, tokenize=False, **opts)
            if ok is None:
                self._fast_ok[key] = self._direct(prepared, tool_list, opts, add_generation_prompt) == text
            return text
        except RecursionError:
            raise BadRequest("the chat template could not render these messages: nested too deeply",
                             param="messages") from None
        except Exception as e:  # a template that raises is the request's problem, never a 500
            raise BadRequest(f"the chat template refused these messages: {_template_message(e)}",
                             param="messages", code="chat_template_error") from None

    def _fast_full(self, prepared: list[dict[str, Any]], tools: list[Any] | None, opts: dict[str, Any],
                   add_generation_prompt: bool) -> str | None:
        """The whole rendering through the fast engine (setting `last_split`), or None where it
        declines; the first render of each (tools, options, add_generation_prompt) is compared
        with apply_chat_template, and a mismatch turns the fast path off for that key."""
        from rowgrove.gateway.core.window import split

        key = _options_key(tools, opts) + (b"1" if add_generation_prompt else b"0")
        if self._fast_verified.get(key) is False or not self._tools_plain(key, tools) or not self._all_plain(prepared):
            return None
        raw = self.fast.render(prepared, tools, opts, add_generation_prompt)
        parts = split(raw) if raw is not None else None
        if parts is None:
            return None
        text = parts.text
        if key not in self._fast_verified:
            try:
                ref = self.tokenizer.apply_chat_template(
                    prepared, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **opts)
            except Exception:
                return None  # the slow path raises the template's own error
            self._fast_verified[key] = ref == text
            if ref != text:
                return None
        self.last_split = parts
        return text

    def fast_window(self, prepared: list[dict[str, Any]], tools: Sequence[Any] | None,
                    options: Mapping[str, Any] | None, start: int, offset: int) -> Any:
        """The window render (`window.Split`) of the messages from `start` on with the generation
        prompt (`offset`: the index of the message the template's loop starts with), or None
        where the fast path declines or has not been verified for these (tools, options) by a
        full render."""
        from rowgrove.gateway.core.window import split

        if self.fast is None:
            return None
        tool_list = list(tools) if tools else None
        opts = dict(options or {})
        if _RESERVED_OPTIONS.intersection(opts):
            return None
        key = _options_key(tool_list, opts) + b"1"
        if start < offset or self._fast_verified.get(key) is not True or not self._tools_plain(key, tool_list) \
                or not self._all_plain(prepared[start:]):
            return None
        raw = self.fast.render(prepared, tool_list, opts, True, start - offset)
        return split(raw, len(prepared) - start) if raw is not None else None

    def _direct(self, prepared: list[dict[str, Any]], tools: list[Any] | None, opts: dict[str, Any],
                add_generation_prompt: bool) -> str:
        # the call apply_chat_template makes after its own normalization, which the prepared
        # messages already satisfy (no null values, reasoning aliased, plain JSON data)
        return self._template.render(messages=prepared, tools=tools, documents=None,
                                     add_generation_prompt=add_generation_prompt, **{**self._special, **opts})

    def _after(self, marker_id: int, rest: str) -> list[int] | None:
        """The ids of `rest` as they follow the added token `marker_id` in one tokenization."""
        marker = self._added_text.get(marker_id)
        if marker is None:
            return None
        # tokenized as a prompt is (`encode_prompt`): the pieces between added tokens, and their
        # lines, that the rollout has seen before are not tokenized again (on Qwen3's vocabulary
        # a 700-character tool result costs the tokenizer about 0.35 ms, per call)
        ids = self.encode_prompt(marker + rest)
        if len(ids) < 2 or ids[0] != marker_id:
            return None
        return ids[1:]

    def _drift_boundary(self, prepared: list[dict[str, Any]], j: int, text: str, tools: Sequence[Any] | None,
                        options: Mapping[str, Any] | None, parent_last: int,
                        images: RequestImages = NO_IMAGES) -> tuple[int, int] | None:
        """(id of the marker that ends the parent's turn in `text`, the offset just after it), or
        None when it cannot be located exactly (see the module docstring)."""
        if j + 1 >= len(prepared):
            return None
        changed = change_one_char(prepared[j + 1])
        if changed is None:
            return None
        alt_msg, original, replacement = changed
        try:
            alt = self._render(prepared[: j + 1] + [alt_msg] + prepared[j + 2:], tools, options, True, images)
        except BadRequest:
            return None
        d = common_prefix(text, alt)
        if d >= len(text) or d >= len(alt) or text[d] != original or alt[d] != replacement:
            return None
        markers, closing = self._turn_markers()
        best, best_id = -1, None
        for mid, mtext in markers:
            at = text.rfind(mtext, 0, d)
            if at >= 0 and at + len(mtext) > best:
                best, best_id = at + len(mtext), mid
        if best_id is None:
            return None
        # A marker that opens the next message (GLM's <|user|> / <|observation|>) must be the very
        # token the model sampled; a marker that closes a turn may stand for any stop token.
        if best_id != parent_last and not (closing and parent_last in self.stop_ids):
            return None
        if not (self._ends_reply(text, best, self._added_text[best_id], prepared[j])
                or self._same_turn_count(text, best, prepared[: j + 1], tools, options, images)):
            return None
        return best_id, best

    def _same_turn_count(self, text: str, end: int, prefix: list[dict[str, Any]], tools: Sequence[Any] | None,
                         options: Mapping[str, Any] | None, images: RequestImages = NO_IMAGES) -> bool:
        """Whether `text[:end]` holds as many turn markers as the template writes for `prefix`
        (the conversation through the parent's turn) on its own: the boundary then closes the
        parent's turn, not an earlier one."""
        try:
            alone = self._render(prefix, tools, options, False, images)
        except BadRequest:
            return False
        markers, _ = self._turn_markers()
        return sum(text.count(m, 0, end) for _, m in markers) == sum(alone.count(m) for _, m in markers)

    def _turn_markers(self) -> tuple[list[tuple[int, str]], bool]:
        """The special tokens that end an assistant turn in this template's rendering of history
        (the stop tokens, plus what the template writes right after an assistant message, such as
        harmony's <|end|>), and whether they close the turn whatever message follows (True: a
        rendered marker may stand for any stop token the model sampled) or open the next message
        (False: GLM's <|user|> / <|observation|> depend on the next role)."""
        if self._markers is None:
            found: dict[int, str] = {i: self._added_text[i] for i in self.stop_ids if i in self._added_text}
            plain = self._marker_after_reply(False, "user")
            to_tool = self._marker_after_reply(True, "tool", plain)
            to_user = self._marker_after_reply(True, "user", plain)
            for mid in (plain, to_tool, to_user):
                if mid is not None:
                    found[mid] = self._added_text[mid]
            seen = {m for m in (plain, to_tool, to_user) if m is not None}
            self._closing = (to_tool is not None and to_tool == to_user) or len(seen) == 1
            self._markers = tuple(found.items())
        return list(self._markers), bool(self._closing)

    def _marker_after_reply(self, with_call: bool, next_role: str, plain: int | None = None) -> int | None:
        """The special token the template writes to end an assistant reply (with or without a
        tool call) followed by a `next_role` message, or None (the template refuses the probe).
        `plain`: the marker after a plain reply, also accepted after a tool call's syntax."""
        mark = "rowgrove_probe" if with_call else "rowgrove probe reply"
        reply: dict[str, Any] = {"role": "assistant", "content": "" if with_call else mark}
        if with_call:  # many templates drop a tool-call turn's content: the anchor is the call's name
            reply["tool_calls"] = [{"id": "call0rowg", "type": "function",
                                    "function": {"name": mark, "arguments": "{}"}}]
        follow = ({"role": "tool", "content": "rowgrove result", "tool_call_id": "call0rowg"}
                  if next_role == "tool" else {"role": "user", "content": "rowgrove next"})
        try:
            text = self.render_text([{"role": "user", "content": "rowgrove probe"}, reply, follow],
                                    None, None, add_generation_prompt=False)
        except BadRequest:
            return None
        at = text.find(mark)  # the reply's, not the tool message's header that may repeat the name
        if at < 0:
            return None
        tail = text[at + len(mark):]
        first: tuple[int, int] | None = None
        for mid, mtext in self._special_text.items():
            k = tail.find(mtext)
            if k < 0 or (first is not None and k >= first[0]):
                continue
            # after a reply's text: the first special token; after a tool call's syntax (which may
            # hold special tokens of its own): the first stop token or plain-reply marker
            if (mid in self.stop_ids or mid == plain) if with_call else (not tail[:k].strip() or mid in self.stop_ids):
                first = (k, mid)
        return None if first is None else first[1]

    def _ends_reply(self, text: str, end: int, marker: str, reply: Mapping[str, Any]) -> bool:
        """Evidence that `text[:end]` ends with the rendering of `reply`: its content's tail, or
        one of its tool calls' names, lies after the previous turn marker."""
        markers, _ = self._turn_markers()
        start = max((text.rfind(m, 0, end - len(marker)) + len(m) for _, m in markers
                     if text.rfind(m, 0, end - len(marker)) >= 0), default=0)
        segment = text[start:end]
        content = reply.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        evidence = []
        if isinstance(content, str) and content.strip():
            evidence.append(content.strip()[-16:])
        for tc in reply.get("tool_calls") or ():
            name = (tc.get("function") or {}).get("name") if isinstance(tc, Mapping) else None
            if isinstance(name, str) and name:
                evidence.append(name)
        return not evidence or any(e in segment for e in evidence)


def _options_key(tools: list[Any] | None, opts: Mapping[str, Any]) -> bytes:
    """What the fast-path verdict is cached by: the tools exactly as sent (key order kept: it is
    the order templates render) and the template variables."""
    try:
        return orjson.dumps([tools, sorted(opts.items())], option=orjson.OPT_NON_STR_KEYS)
    except (orjson.JSONEncodeError, TypeError):
        return repr((tools, sorted(opts.items(), key=str))).encode()


def _compiled_template(tokenizer: Any) -> Any:
    """The tokenizer's chat template compiled as apply_chat_template compiles it, or None when this
    transformers has no such helper (then every render goes through apply_chat_template)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    try:
        return _compile_jinja_template(tokenizer.chat_template)
    except Exception as e:
        raise InputError(f"the tokenizer's chat template does not compile: {e}") from None


def _template_message(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    if len(text) > 500:
        text = text[:497] + "..."
    return text if not isinstance(e, TypeError | KeyError | AttributeError | IndexError) else f"{type(e).__name__}: {text}"


__all__ = ["Continuation", "Rendered", "Renderer"]
