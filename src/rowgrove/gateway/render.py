"""Chat-template rendering for the gateway: a root prompt in full, and the part a continuation adds
after its parent's sampled tokens, checked rather than assumed.

Why the new part is rendered from a probe. A continuation keeps its parent's exact tokens (prompt +
sampled, ending with the end-of-turn token) and appends only what the template writes after an
assistant turn: the glue after the end-of-turn string, the new user/tool messages, and the
generation prompt. Rendering the parent's real conversation and slicing would be wrong for templates
that rewrite history (the Qwen3-style template drops earlier `<think>` reasoning once a new user
message arrives, so rendering(prefix) is not a prefix of rendering(prefix + new)), and it would cost
O(history) per call. So the new part is rendered after a small neutral *probe* conversation that
ends with an assistant turn:

    text  = template(probe + new, add_generation_prompt=True)
    k     = end of the probe assistant's end-of-turn string in template(probe)
    ids   = tokenize(text)                          (add_special_tokens=False)
    check   text[:k] == template(probe)[:k]         (the probe renders the same with `new` after it)
    check   ids[:P] == tokenize(text[:k])           (no token merges across the end-of-turn boundary)
    new part = ids[P:]

and the answer must not depend on the probe: a second, structurally different probe (a system
message, an earlier exchange, an assistant turn with a tool call) must give the same ids. That
check is about the template's structure, so it runs once per (tools, options, shape of the new
messages) and is cached, together with a tokenization of the whole probe rendering. On later calls
of a known shape the text check runs again, and only end-of-turn + new part is tokenized: exact
when the end-of-turn token cuts the text (an added token matched on raw text that strips no
whitespace, checked once per tokenizer); for other tokenizers the whole probe rendering is
tokenized on every call. Any failure makes `render_continuation` return None and the gateway start
a root instead.

Cost: a continuation renders the probe plus the new messages and tokenizes the new part, never
the history.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from rowgrove.errors import BadRequest, InputError
from rowgrove.hashing import chain_start

# apply_chat_template's own parameters: a chat_template_kwargs key with one of these names would
# change how rendering works rather than what the template sees.
_RESERVED_OPTIONS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens",
    "messages",
})

# The probes: neutral conversations ending with an assistant turn whose content is a marker that
# locates that turn's end-of-turn string. The second differs in structure (system message, an
# earlier exchange, a tool call on the last assistant turn) so that a template whose rendering of
# the new part depends on what came before is caught.
_MARK_1 = "rowgrove probe reply one"
_MARK_2 = "rowgrove probe reply two"
_PROBE_1: list[dict[str, Any]] = [
    {"role": "user", "content": "rowgrove probe question"},
    {"role": "assistant", "content": _MARK_1},
]
_PROBE_2: list[dict[str, Any]] = [
    {"role": "system", "content": "rowgrove probe system"},
    {"role": "user", "content": "rowgrove first probe question"},
    {"role": "assistant", "content": "rowgrove first probe reply"},
    {"role": "user", "content": "rowgrove second probe question"},
    {"role": "assistant", "content": _MARK_2, "tool_calls": [{
        "id": "call_rowgrove_probe", "type": "function",
        "function": {"name": "rowgrove_probe", "arguments": "{}"},
    }]},
]


class _Probe:
    """One probe rendered for one (tools, options): its text through the end-of-turn string and
    the ids of that text. `ok` is False when the template could not render it usably."""

    __slots__ = ("messages", "ok", "prefix_text", "prefix_ids")

    def __init__(self, messages: list[dict[str, Any]], prefix_text: str = "", prefix_ids: list[int] | None = None):
        self.messages = messages
        self.prefix_text = prefix_text
        self.prefix_ids = prefix_ids or []
        self.ok = bool(prefix_ids)


class Renderer:
    """Renders requests with a tokenizer's chat template into prompt token ids.

    `tokenizer` is a transformers fast tokenizer with a `chat_template`; `end_of_turn_id` is the id
    the model samples to end its turn (found from the template when not given). Template variables
    (`options`, the request's `chat_template_kwargs` such as `{"enable_thinking": False}`) and
    `tools` are passed to the template as `apply_chat_template` does.
    """

    def __init__(self, tokenizer: Any, *, end_of_turn_id: int | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise InputError("the tokenizer has no chat template: load one that ships chat_template.jinja")
        self.tokenizer = tokenizer
        # Fast paths, each equal to the transformers call it replaces: the backend tokenizer's own
        # encode (fast tokenizers), and the compiled template rendered directly, trusted per
        # (tools, options) only after it matched apply_chat_template once.
        self._backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        self._template = _compiled_template(tokenizer)
        self._special = dict(tokenizer.special_tokens_map)
        self._fast_ok: dict[bytes, bool] = {}
        if end_of_turn_id is None:
            from rowgrove.model.load import end_of_turn_id as find_end_of_turn

            end_of_turn_id = find_end_of_turn(tokenizer)
        self.end_of_turn_id: int = int(end_of_turn_id)
        self.end_of_turn_text: str = tokenizer.decode([self.end_of_turn_id], skip_special_tokens=False)
        # The end-of-turn string must come back as that single id, or the boundary can't be found.
        self._eot_single = self._encode(self.end_of_turn_text) == [self.end_of_turn_id]
        self._eot_splits = _splits_text(tokenizer, self.end_of_turn_id)
        self._probes: dict[bytes, tuple[_Probe, _Probe]] = {}
        self._shapes: dict[tuple[bytes, tuple[Any, ...]], bool] = {}

    # -- public ---------------------------------------------------------------------------------

    def render_text(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
                    options: Mapping[str, Any] | None = None, *, add_generation_prompt: bool = True) -> str:
        """The template's text for `messages`. BadRequest when the template refuses them (an
        unknown role, a content part it cannot render) or an option clashes with a renderer
        parameter."""
        opts = dict(options or {})
        clash = sorted(_RESERVED_OPTIONS.intersection(opts))
        if clash:
            raise BadRequest(
                f"chat_template_kwargs may not set {', '.join(clash)}: these are rendering parameters, "
                "not template variables; remove them", param="chat_template_kwargs")
        msgs, tool_list = list(messages), list(tools) if tools else None
        try:
            plain = self._template is not None and all(
                isinstance(m, dict) and isinstance(m.get("content"), str | None) for m in msgs)
            key = chain_start(tool_list, opts) if plain else b""
            ok = self._fast_ok.get(key) if plain else False
            if ok:
                return self._template.render(messages=msgs, tools=tool_list,
                                             add_generation_prompt=add_generation_prompt, **self._special, **opts)
            text = self.tokenizer.apply_chat_template(
                msgs, tools=tool_list, add_generation_prompt=add_generation_prompt, tokenize=False, **opts)
            if plain and ok is None:
                fast = self._template.render(messages=msgs, tools=tool_list,
                                             add_generation_prompt=add_generation_prompt, **self._special, **opts)
                self._fast_ok[key] = fast == text
            return text
        except jinja2.TemplateError as e:
            raise BadRequest(f"the chat template cannot render these messages: {e}", param="messages") from None

    def render_root(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
                    options: Mapping[str, Any] | None = None) -> list[int]:
        """The full prompt ids of `messages` with the generation prompt (add_special_tokens=False:
        whatever BOS the template writes is the only one)."""
        return self._encode(self.render_text(messages, tools, options))

    def render_continuation(self, new_messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None,
                            options: Mapping[str, Any] | None = None) -> list[int] | None:
        """The ids that follow a parent's sampled ids (which end with `end_of_turn_id`): template
        glue after an assistant turn + `new_messages` rendered + the generation prompt.

        None when the template cannot render the new part on its own consistently: the probe's
        rendering changes when `new_messages` follow it, tokens merge across the end-of-turn
        boundary, the result depends on the probe, or the template refuses the probe. The caller
        then renders a root instead.
        """
        if not new_messages or not self._eot_single:
            return None
        opts = dict(options or {})
        if _RESERVED_OPTIONS.intersection(opts):
            return None
        key = chain_start(tools, opts)
        probes = self._probes.get(key)
        if probes is None:
            probes = (self._make_probe(_PROBE_1, _MARK_1, tools, opts), self._make_probe(_PROBE_2, _MARK_2, tools, opts))
            self._probes[key] = probes
        first, second = probes
        if not (first.ok and second.ok):
            return None
        new = list(new_messages)
        shape = (key, _shape(new))
        verdict = self._shapes.get(shape)
        ids = self._after_probe(first, new, tools, opts, whole=verdict is None or not self._eot_splits)
        if ids is None:
            return None
        if verdict is None:
            verdict = ids == self._after_probe(second, new, tools, opts, whole=True)
            self._shapes[shape] = verdict
        return ids if verdict else None

    # -- internals ------------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _make_probe(self, messages: list[dict[str, Any]], mark: str, tools: Sequence[Any] | None,
                    opts: dict[str, Any]) -> _Probe:
        try:
            text = self.render_text(messages, tools, opts, add_generation_prompt=False)
        except (BadRequest, ValueError, TypeError):
            return _Probe(messages)
        at = text.rfind(mark)
        eot = text.find(self.end_of_turn_text, at + len(mark)) if at >= 0 else -1
        if eot < 0:
            return _Probe(messages)
        prefix = text[: eot + len(self.end_of_turn_text)]
        ids = self._encode(prefix)
        if not ids or ids[-1] != self.end_of_turn_id:
            return _Probe(messages)
        return _Probe(messages, prefix, ids)

    def _after_probe(self, probe: _Probe, new: list[Any], tools: Sequence[Any] | None,
                     opts: dict[str, Any], *, whole: bool) -> list[int] | None:
        """The ids the template writes after `probe`'s end-of-turn when `new` follows, or None.

        `whole`: tokenize the whole probe rendering and require it to start with the probe's own
        ids (no merge across the boundary). Otherwise, when the end-of-turn token splits the text
        (checked once, `_splits_text`), tokenize only end-of-turn + the rest: the same ids at a
        cost that does not include the probe."""
        try:
            text = self.render_text(probe.messages + new, tools, opts, add_generation_prompt=True)
        except (BadRequest, ValueError, TypeError):
            return None
        if not text.startswith(probe.prefix_text):
            return None
        if whole:
            ids = self._encode(text)
            n = len(probe.prefix_ids)
            if len(ids) <= n or ids[:n] != probe.prefix_ids:
                return None
            return ids[n:]
        ids = self._encode(self.end_of_turn_text + text[len(probe.prefix_text):])
        if len(ids) <= 1 or ids[0] != self.end_of_turn_id:
            return None
        return ids[1:]


def _compiled_template(tokenizer: Any) -> Any:
    """The tokenizer's chat template compiled as apply_chat_template compiles it, or None when this
    transformers has no such helper (then every render goes through apply_chat_template)."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return None
    return _compile_jinja_template(tokenizer.chat_template)


def _splits_text(tokenizer: Any, token_id: int) -> bool:
    """Whether the added token `token_id` cuts the text it appears in, so that what follows it is
    tokenized independently of what precedes it: matched on raw text (not normalized), eating no
    whitespace on either side, not restricted to whole words."""
    added = getattr(tokenizer, "added_tokens_decoder", {}).get(token_id)
    if added is None:
        return False
    return not (added.normalized or added.lstrip or added.rstrip or added.single_word)


def _shape(messages: list[Any]) -> tuple[Any, ...]:
    """What the probe-independence verdict is cached by: each new message's role, whether its
    content is a list of parts, and which optional fields it carries."""
    out = []
    for m in messages:
        if not isinstance(m, Mapping):
            out.append((type(m).__name__,))
            continue
        out.append((m.get("role"), isinstance(m.get("content"), list), "name" in m))
    return tuple(out)

