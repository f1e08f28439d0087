"""The fast renderer: a chat template's window form (`rowgrove.gateway.core.incremental`) rendered by
MiniJinja, the Rust engine Hugging Face's text-generation-inference (TGI) renders chat templates
with, in the environment `apply_chat_template` builds.

Why it is exact, or declines:
- the environment is transformers' (`chat_template_utils._compile_jinja_template`): trim_blocks,
  lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, and its `tojson`
  (`json.dumps(..., ensure_ascii=False)`, where MiniJinja's own escapes `<`, `>`, `&`, `'`);
- the template may use only the filters, tests and string methods listed here, each one that
  MiniJinja implements as Python does on the values a request can carry; any other name declines
  (checked on the template's syntax tree once);
- a value the template prints must be a string or an integer: printing a list, a mapping, a
  float, a boolean or none differs between the engines (Python's repr against MiniJinja's), so
  such a render raises and the caller renders with jinja2 instead; any MiniJinja error does the
  same, so a template's own `raise_exception` message is always jinja2's;
- strings holding U+001C..U+001F decline (Python's `str.strip` and `split` treat them as
  whitespace, Rust's do not);
- the caller compares the first render of each (tools, options) with `apply_chat_template`
  before trusting it.

`render(...)` returns the window text; `split(...)` takes it apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.nodes as jn
import orjson

from rowgrove.gateway.core.incremental import MARK, VMARK, Window

try:  # pinned in pyproject; without it every render goes through jinja2
    import minijinja
except ImportError:  # pragma: no cover
    minijinja = None

_FILTERS = frozenset({"tojson", "length", "trim", "upper", "lower", "items", "first", "last", "join",
                      "default", "d", "list", "reverse", "count", "replace"})
_ORDER = frozenset({"lt", "gt", "lteq", "gteq"})
# not `sequence` (a string is one in jinja2, not in MiniJinja)
_TESTS = frozenset({"defined", "undefined", "none", "string", "mapping", "iterable", "number",
                    "integer", "true", "false", "boolean", "eq", "equalto", "ne", "in"})
_METHODS = frozenset({"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "items", "keys",
                      "values", "get", "upper", "lower", "replace"})
_GLOBALS = frozenset({"raise_exception", "strftime_now", "namespace", "range", "dict"})
_ODD_SPACE = re.compile("[\x1c-\x1f]")


class _Unprintable(Exception):
    """A value whose printed form differs between the engines."""


def _finalize(value: Any) -> Any:
    if type(value) is str or type(value) is int:
        return value
    raise _Unprintable(type(value).__name__)


# what `_tojson` wrote, by the value's orjson bytes and the filter's arguments: a request's tools
# are written again at every call of its rollout (about a third of a window render on Qwen3's
# template). orjson's bytes tell apart every two values json.dumps writes differently (1 / 1.0 /
# true, -0.0, key order, every string) except null against NaN and infinities, so a value whose
# bytes hold a null is not remembered; a value orjson does not take as plain JSON data (a
# subclass, a dataclass, an int over 64 bits, a key that is not a string) is written each time.
_TOJSON: dict[tuple[bytes, Any, Any, Any, Any], str] = {}
_TOJSON_SIZE = 4096
_PLAIN = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' tojson, byte for byte
    try:
        raw = orjson.dumps(x, option=_PLAIN)
    except TypeError:
        raw = None
    if raw is None or b"null" in raw or type(indent) not in (type(None), int, str) \
            or not isinstance(separators, tuple | list | type(None)):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    key = (raw, bool(ensure_ascii), indent, tuple(separators) if separators is not None else None, bool(sort_keys))
    text = _TOJSON.get(key)
    if text is None:
        text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        if len(_TOJSON) >= _TOJSON_SIZE:
            _TOJSON.clear()
        _TOJSON[key] = text
    return text


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def supported(source: str) -> str | None:
    """None when MiniJinja may render `source` (every filter, test, method and function it calls is
    listed above or a macro of its own, and it uses no `~` concatenation or `%` formatting outside
    `raise_exception`), else why not."""
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateError as e:
        return f"does not parse: {e}"
    for node in ast.find_all(jn.Filter):
        if node.name not in _FILTERS:
            return f"filter {node.name}"
    for node in ast.find_all(jn.Test):
        if node.name not in _TESTS:
            return f"test {node.name}"
    raising = set()
    macros = {m.name for m in ast.find_all(jn.Macro)}
    for node in ast.find_all(jn.Call):
        if isinstance(node.node, jn.Name) and node.node.name not in macros | _GLOBALS:
            return f"function {node.node.name}"
        if isinstance(node.node, jn.Name) and node.node.name == "raise_exception":
            raising.update(id(n) for n in node.find_all(jn.Node))
        elif isinstance(node.node, jn.Getattr) and node.node.attr not in _METHODS:
            return f"method {node.node.attr}"
    for node in ast.find_all(jn.Concat | jn.Mod):
        if id(node) not in raising:
            return f"{type(node).__name__} outside raise_exception (stringifies values)"
    # an ordering comparison of a string with a number is an error in jinja2 and False in MiniJinja:
    # its operands may only be numbers the template computes itself (positions, lengths, counters)
    assigns = [a for a in ast.find_all(jn.Assign) if isinstance(a.target, jn.Name | jn.NSRef)]
    namespaces = {a.target.name for a in assigns if isinstance(a.target, jn.Name) and isinstance(a.node, jn.Call)
                  and isinstance(a.node.node, jn.Name) and a.node.node.name == "namespace"}
    loop_targets = {t.name for f in ast.find_all(jn.For) for t in f.target.find_all(jn.Name)} | \
        {f.target.name for f in ast.find_all(jn.For) if isinstance(f.target, jn.Name)}
    # names (and namespace attributes, as "ns.attr") every assignment of which is a counted number
    names = {a.target.name for a in assigns if isinstance(a.target, jn.Name)} - namespaces - loop_targets
    local = set(names)
    for _ in range(len(names) + 1):  # drop a name fed by anything uncounted, until nothing changes
        keep = {n for n in local if all(_counted(a.node, local, namespaces) for a in assigns
                                        if isinstance(a.target, jn.Name) and a.target.name == n)}
        if keep == local:
            break
        local = keep
    uncounted: set[tuple[str, str]] = set()  # namespace attributes fed by anything else
    for a in assigns:
        if isinstance(a.target, jn.NSRef) and not _counted(a.node, local, namespaces):
            uncounted.add((a.target.name, a.target.attr))
        elif isinstance(a.target, jn.Name) and a.target.name in namespaces and isinstance(a.node, jn.Call):
            uncounted.update((a.target.name, k.key) for k in a.node.kwargs
                             if not _counted(k.value, local, namespaces))
    for node in ast.find_all(jn.Compare):
        if any(op.op in _ORDER for op in node.ops) and not all(
                _counted(x, local, namespaces, uncounted) for x in [node.expr, *(op.expr for op in node.ops)]):
            return "an ordering comparison of values the request carries"
    for node in ast.find_all(jn.Slice):
        step = node.step.node if isinstance(node.step, jn.Neg) else node.step
        if step is not None and not (isinstance(step, jn.Const) and step.value == 1):
            return "a slice step"
    return None


def _counted(node: jn.Node, local: set[str], namespaces: set[str],
             uncounted: set[tuple[str, str]] = frozenset()) -> bool:
    """Whether `node` is a number the template computes itself: a constant, a `loop` attribute, a
    `length`, a variable or namespace attribute the template sets only to such numbers, or
    arithmetic of those."""
    if isinstance(node, jn.Const):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, jn.Getattr) and isinstance(node.node, jn.Name):
        name = node.node.name
        return name == "loop" or (name in namespaces and (name, node.attr) not in uncounted)
    if isinstance(node, jn.Filter):
        return node.name in ("length", "count")
    if isinstance(node, jn.Name):
        return node.name in local
    if isinstance(node, jn.Add | jn.Sub | jn.Mul | jn.FloorDiv):
        return _counted(node.left, local, namespaces, uncounted) and _counted(node.right, local, namespaces, uncounted)
    if isinstance(node, jn.Neg | jn.Pos):
        return _counted(node.node, local, namespaces, uncounted)
    return False


@dataclass(frozen=True)
class Split:
    """A window render taken apart: `pre` (before the first rendered message), `v` (the values of
    the template's variables that its loop body reads), `items` (one per rendered message; the
    last also holds what follows the loop, the generation prompt)."""

    pre: str
    v: str
    items: list[str]

    @property
    def text(self) -> str:
        """What the template writes for the rendered messages (pre + items)."""
        return self.pre + "".join(self.items)


def split(text: str, rendered: int | None = None) -> Split | None:
    """`text` (a window render) taken apart, or None when its marks are not where the window form
    puts them (message text that holds a mark). `rendered`: how many messages must be rendered."""
    parts = text.split(MARK)
    if len(parts) < 2:
        if VMARK in text:
            return None
        return Split(text, "", []) if rendered in (None, 0) else None
    head = parts[1]
    if not head.startswith(VMARK):
        return None
    end = head.rfind(VMARK)
    v, first = head[len(VMARK): end], head[end + len(VMARK):]
    items = [first, *parts[2:]]
    if VMARK in first or any(VMARK in p for p in parts[2:]) or VMARK in parts[0]:
        return None
    if rendered is not None and len(items) != rendered:
        return None
    return Split(parts[0], v, items)


class FastEngine:
    """MiniJinja over a template's window form; `render` returns None where it declines."""

    def __init__(self, window: Window, special: Mapping[str, Any]):
        self.window = window
        env = minijinja.Environment()
        env.trim_blocks = True
        env.lstrip_blocks = True
        env.keep_trailing_newline = False
        env.pycompat = True
        env.finalizer = _finalize
        env.add_filter("tojson", _tojson)
        env.add_filter("rowgrove_v", repr)  # the window's loop variables, compared only with themselves
        env.add_function("raise_exception", _raise_exception)
        env.add_function("strftime_now", _strftime_now)
        env.add_template("window", window.source)
        self._env = env
        self._special = dict(special)

    def render(self, prepared: Sequence[Mapping[str, Any]], tools: Any, opts: Mapping[str, Any],
               add_generation_prompt: bool, start: int = 0) -> str | None:
        """The window text rendering the loop from position `start` on (0: the whole rendering),
        or None (declined)."""
        try:
            return self._env.render_template(
                "window", messages=prepared, tools=tools, documents=None,
                add_generation_prompt=add_generation_prompt, rowgrove_from=start, rowgrove_mark=MARK,
                rowgrove_vmark=VMARK, **{**self._special, **opts})
        except Exception:  # any MiniJinja error: jinja2 renders it (and words its error)
            return None


def plain(value: Any) -> bool:
    """Whether every string in `value` (a prepared message, tools) is free of the characters the
    engines strip differently."""
    if isinstance(value, str):
        return _ODD_SPACE.search(value) is None
    if isinstance(value, Mapping):
        return all(plain(k) and plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(plain(v) for v in value)
    return True


def fast_engine(chat_template: str, special: Mapping[str, Any]) -> tuple[FastEngine | None, str]:
    """The fast engine for `chat_template`, or None and why not."""
    from rowgrove.gateway.core.incremental import analyse

    if minijinja is None:
        return None, "minijinja is not installed"
    why = supported(chat_template)
    if why is not None:
        return None, f"MiniJinja may differ from jinja2 here ({why})"
    window = analyse(chat_template)
    if isinstance(window, str):
        return None, window
    try:
        return FastEngine(window, special), ""
    except Exception as e:
        return None, f"MiniJinja cannot compile the template: {e}"


__all__ = ["FastEngine", "Split", "fast_engine", "plain", "split", "supported"]
