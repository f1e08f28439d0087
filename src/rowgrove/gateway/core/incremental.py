"""A per-template proof that a continuation's new part can be rendered without the history, and
the window form of the template that renders it.

A continuation's prompt is the parent's exact context followed by what the template writes after
the parent's turn in its rendering of the whole request (`rowgrove.gateway.core.render`). Rendering the
whole request costs O(history) per call, O(T^2) per rollout. Most chat templates have this shape:

    PRE                                   statements before the main loop (system block, tools,
                                          scans such as Qwen3's "last real user query")
    {% for message in messages %} B {% endfor %}
    POST                                  the generation prompt

and write B(i) for message i from a small set of inputs only. This module proves that from the
template's syntax tree (jinja2's parser, the one `apply_chat_template` compiles with) and, when it
holds, rewrites the template into a *window* form that renders PRE and POST in full but B(i) only
for loop positions from `rowgrove_from` on (a loop over `messages[1:]` starts one message
later: the caller keeps that offset), with a mark before each rendered B(i) and the values of
PRE's variables that B reads (through the engine's `rowgrove_v` filter, a repr) after the first
mark:

    OUT_PRE  MARK  V  MARK  B(s)  MARK  B(s+1) ...  MARK  B(n-1) POST

The proof (`analyse`), each clause a syntax-tree check; anything else declines:
- exactly one top-level `for <name> in messages` (no filter, no else, not recursive), and nothing
  assigns `messages`;
- B carries no state from one iteration to the next: no namespace attribute assigned in B (or in
  a macro), no mutating method call, no `break`, no `loop.changed`, and every variable B assigns
  is assigned before B reads it in the same iteration (definite assignment over if/else);
- B reads the conversation only as its loop item, `messages[0]`, `messages[loop.index0 + 1]`,
  `loop.nextitem`, and `messages[loop.index0 - 1]` under a `loop.first or ...` guard; no
  `messages | length`, `loop.length` or `loop.revindex` inside B; nested loops do not index
  `messages`;
- B reads other variables only as template variables (fixed by the request's tools and options)
  or as variables PRE assigns: those are V, printed after the first mark.

So B(i) is a function of (message i, message i+1, its position flags, V, the request's tools and
options). Two requests whose first k messages are byte-identical and whose OUT_PRE and V are equal
render B(0..k-2) identically: a continuation renders the window from the parent's last request
message and compares only that window with the parent's stored tail (`render.Renderer`).

The rewrite inserts tags only right after the main loop's `for` tag and right before its `endfor`,
copying the tags' whitespace-control signs, and is checked by parsing it again: its syntax tree
must be the original one with the loop body wrapped in the inserted `if` (jinja2 applies
whitespace control in the lexer, so equal trees render equal text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import jinja2
import jinja2.nodes as jn

MARK = "\x00rowgrove\x00"     # before each rendered B(i); a render whose text holds it otherwise declines
VMARK = "\x00rowgrove-v\x00"  # around each value of V

_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault",
                       "popitem", "sort", "reverse", "add", "discard"})
_LOOP_OK = frozenset({"index0", "index", "first", "last", "cycle", "depth", "depth0", "nextitem", "previtem"})
_BLOCK = re.compile(r"\{%([-+]?)\s*(\w+)(.*?)([-+]?)%\}", re.S)
_COMMENT = re.compile(r"\{#.*?#\}", re.S)


@dataclass(frozen=True)
class Window:
    """A template proven renderable from a window: `source` is its window form, `pre_vars` the
    names of PRE's variables that the loop body reads (printed after the first mark)."""

    source: str
    pre_vars: tuple[str, ...]


class Decline(Exception):
    """The template does not have a shape this module can prove (the message says which clause)."""


def analyse(source: str) -> Window | str:
    """The window form of `source`, or a sentence saying why the proof declined."""
    try:
        return _analyse(source)
    except Decline as e:
        return str(e)
    except (jinja2.TemplateError, RecursionError) as e:
        return f"the template does not parse: {e}"


def _env() -> jinja2.Environment:
    # the lexer settings of transformers' chat-template environment (trim_blocks, lstrip_blocks,
    # loopcontrols); the generation tag it adds is declined below as an unknown tag
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])


def _analyse(source: str) -> Window:
    if "rowgrove_" in source or MARK in source:
        raise Decline("the template uses rowgrove's reserved names")
    if re.search(r"\{%[-+]?\s*(raw|generation)\b", source):
        raise Decline("raw or generation blocks")
    ast = _env().parse(source)
    seq = _sequence_names(ast)
    tops = [k for k, n in enumerate(ast.body) if isinstance(n, jn.For) and _is_seq(n.iter, seq)]
    loops_over_messages = [n for n in ast.find_all(jn.For) if _is_seq(n.iter, seq)]
    if len(tops) != 1 or len(loops_over_messages) != 1:
        raise Decline("no single top-level loop over messages")
    main: jn.For = ast.body[tops[0]]
    if main.else_ or main.test is not None or main.recursive or not isinstance(main.target, jn.Name):
        raise Decline("the main loop has an else, a filter or recursion")
    item = main.target.name
    macros = {m.name: m for m in ast.find_all(jn.Macro)}
    for macro in macros.values():
        _check_no_state(macro.body, "a macro")
        if _reads_outside_loops(macro.body, "loop") or any(
                isinstance(n, jn.Name) and n.name in seq for n in _walk(macro.body)):
            raise Decline("a macro reads messages or the main loop")
    _check_no_state(main.body, "the main loop")
    pre_assigned = set()
    for node in ast.body[: tops[0]]:
        if isinstance(node, jn.Macro):
            continue  # a macro's assignments are its own
        for a in _walk_nodes(node, (jn.Assign, jn.AssignBlock)):
            pre_assigned.update(t.name for t in _targets(a.target) if isinstance(t, jn.Name))
    reads = _Reads(item, macros, seq)
    reads.block(main.body, {item, "loop"})
    stale = reads.free & reads.assigned_in_body
    if stale:
        raise Decline(f"the main loop reads {', '.join(sorted(stale))} before assigning it (state across messages)")
    for node in _walk(main.body):
        _check_conversation_access(node, item)
    free = set(reads.free)
    for macro in macros.values():  # a macro may read the template's top-level variables
        free.update(n.name for n in _walk(macro.body) if isinstance(n, jn.Name) and n.ctx == "load")
    pre_vars = tuple(sorted(n for n in free if n in pre_assigned))
    latches = {id(n): flag for n in ast.body[: tops[0]] if isinstance(n, jn.For)
               for flag in [_latch(n, _namespaces(ast))] if flag is not None}
    window = _rewrite(source, main, ast, pre_vars, latches)
    return Window(window, pre_vars)


def _is_messages(node: jn.Node) -> bool:
    return isinstance(node, jn.Name) and node.name == "messages"


def _is_suffix(node: jn.Node) -> bool:
    """`messages` or `messages[1:]`: a suffix of the conversation."""
    if _is_messages(node):
        return True
    return (isinstance(node, jn.Getitem) and _is_messages(node.node) and isinstance(node.arg, jn.Slice)
            and isinstance(node.arg.start, jn.Const) and node.arg.start.value == 1
            and node.arg.stop is None and node.arg.step is None)


def _sequence_names(ast: jn.Template) -> frozenset[str]:
    """`messages` and the names every assignment of which is a suffix of it (ChatML's `rest`,
    assigned `messages[1:]` after a system message, else `messages`). A template that assigns
    `messages` itself declines."""
    assigned: dict[str, list[jn.Node]] = {}
    for node in ast.find_all(jn.Assign):
        for t in _targets(node.target):
            if isinstance(t, jn.Name):
                assigned.setdefault(t.name, []).append(node.node if not isinstance(node.target, jn.Tuple) else node)
    for node in ast.find_all(jn.For):
        for t in _targets(node.target):
            if isinstance(t, jn.Name):
                assigned.setdefault(t.name, []).append(node)
    if "messages" in assigned:
        raise Decline("the template reassigns messages")
    names = {"messages"}
    for name, values in assigned.items():
        if all(_is_suffix(v) for v in values):
            names.add(name)
    return frozenset(names)


def _is_seq(node: jn.Node, seq: frozenset[str]) -> bool:
    return _is_suffix(node) or (isinstance(node, jn.Name) and node.name in seq)


def _targets(node: jn.Node) -> list[jn.Node]:
    return list(node.items) if isinstance(node, jn.Tuple) else [node]


def _walk(body: list[jn.Node]):
    for node in body:
        yield node
        yield from node.find_all(jn.Node)


def _walk_nodes(node: jn.Node, kinds: tuple[type, ...]):
    if isinstance(node, kinds):
        yield node
    yield from node.find_all(kinds)


def _reads_outside_loops(body: list[jn.Node], name: str) -> bool:
    """Whether `body` reads `name` outside a `for` of its own (inside one, `loop` is that loop's)."""
    for node in body:
        if isinstance(node, jn.For):
            if _reads_outside_loops([node.iter], name):
                return True
            continue
        if isinstance(node, jn.Name) and node.name == name:
            return True
        if _reads_outside_loops(list(node.iter_child_nodes()), name):
            return True
    return False


def _check_no_state(body: list[jn.Node], where: str) -> None:
    for node in _walk(body):
        if isinstance(node, jn.Assign | jn.AssignBlock) and any(isinstance(t, jn.NSRef) for t in _targets(node.target)):
            raise Decline(f"{where} assigns a namespace attribute (state across messages)")
        if isinstance(node, jn.Break):
            raise Decline(f"{where} breaks out of a loop")
        if isinstance(node, jn.Call) and isinstance(node.node, jn.Getattr) and node.node.attr in _MUTATORS:
            raise Decline(f"{where} calls a mutating method ({node.node.attr})")
        if isinstance(node, jn.Include | jn.Import | jn.FromImport | jn.Extends | jn.Block | jn.CallBlock
                      | jn.FilterBlock | jn.Scope | jn.ScopedEvalContextModifier | jn.With):
            raise Decline(f"{where} uses {type(node).__name__}")
        if isinstance(node, jn.Getattr) and isinstance(node.node, jn.Name) and node.node.name == "loop" \
                and node.attr == "changed":
            raise Decline(f"{where} uses loop.changed")


def _check_conversation_access(node: jn.Node, item: str) -> None:
    """The clause on how the main loop's body may read the conversation (module docstring)."""
    if isinstance(node, jn.Getattr) and isinstance(node.node, jn.Name) and node.node.name == "loop":
        if node.attr not in _LOOP_OK:
            raise Decline(f"the main loop reads loop.{node.attr}")


class _Reads:
    """Free variables of the loop body, with the definite-assignment check."""

    def __init__(self, item: str, macros: dict[str, jn.Macro], seq: frozenset[str]):
        self.item = item
        self.seq = seq
        self.macros = macros
        self.free: set[str] = set()
        self.assigned_in_body: set[str] = set()
        self.depth = 0  # nested loops inside the main loop
        self.guard_first = 0  # inside the right side of `loop.first or ...`

    def block(self, body: list[jn.Node], defined: set[str]) -> set[str]:
        for node in body:
            defined = self.stmt(node, defined)
        return defined

    def stmt(self, node: jn.Node, defined: set[str]) -> set[str]:
        if isinstance(node, jn.Output):
            for n in node.nodes:
                self.expr(n, defined)
            return defined
        if isinstance(node, jn.Assign):
            self.expr(node.node, defined)
            names = {t.name for t in _targets(node.target) if isinstance(t, jn.Name)}
            self.assigned_in_body |= names
            return defined | names
        if isinstance(node, jn.AssignBlock):
            self.block(node.body, defined)
            names = {t.name for t in _targets(node.target) if isinstance(t, jn.Name)}
            self.assigned_in_body |= names
            return defined | names
        if isinstance(node, jn.If):
            self.expr(node.test, defined)
            outs = [self.block(node.body, set(defined))]
            for elif_ in node.elif_:
                self.expr(elif_.test, defined)
                outs.append(self.block(elif_.body, set(defined)))
            outs.append(self.block(node.else_, set(defined)))
            return set.intersection(*outs)
        if isinstance(node, jn.For):
            self.expr(node.iter, defined)
            if node.test is not None:
                raise Decline("a filtered loop inside the main loop")
            inner = defined | {t.name for t in _targets(node.target) if isinstance(t, jn.Name)} | {"loop"}
            self.depth += 1
            self.block(node.body, set(inner))
            self.block(node.else_, set(defined))
            self.depth -= 1
            return defined
        if isinstance(node, jn.Macro):
            raise Decline("a macro defined inside the main loop")
        if isinstance(node, jn.ExprStmt):
            self.expr(node.node, defined)
            return defined
        if isinstance(node, jn.Continue):
            return defined
        raise Decline(f"the main loop uses {type(node).__name__}")

    def expr(self, node: jn.Node, defined: set[str]) -> None:
        if isinstance(node, jn.Getattr) and isinstance(node.node, jn.Name) and node.node.name == "loop":
            return  # loop.<attr>: which attributes may be read is checked on the whole body
        if isinstance(node, jn.Name) and node.name == "loop":
            raise Decline("the main loop passes `loop` whole (a macro could read its length)")
        if isinstance(node, jn.Name):
            self.name(node.name, defined)
            return
        if isinstance(node, jn.Getitem) and isinstance(node.node, jn.Name) and node.node.name in self.seq:
            self.messages_index(node.arg)
            return
        if isinstance(node, jn.Or) and _is_first(node.left):
            self.expr(node.left, defined)
            self.guard_first += 1
            self.expr(node.right, defined)
            self.guard_first -= 1
            return
        if isinstance(node, jn.Call) and isinstance(node.node, jn.Name) and node.node.name in self.macros:
            for a in list(node.args) + [k.value for k in node.kwargs]:
                self.expr(a, defined)
            return
        for child in node.iter_child_nodes():
            self.expr(child, defined)

    def name(self, name: str, defined: set[str]) -> None:
        if name in self.seq:
            raise Decline("the main loop reads messages other than by a neighbour's index")
        if name in defined:
            return
        if name in self.macros:
            return
        self.free.add(name)

    def messages_index(self, arg: jn.Node) -> None:
        if self.depth:
            raise Decline("a nested loop indexes messages")
        if isinstance(arg, jn.Const) and arg.value == 0:
            return
        if isinstance(arg, jn.Add) and _is_loop_attr(arg.left, "index0") and isinstance(arg.right, jn.Const) \
                and arg.right.value == 1:
            return
        if isinstance(arg, jn.Sub) and _is_loop_attr(arg.left, "index0") and isinstance(arg.right, jn.Const) \
                and arg.right.value == 1 and self.guard_first:
            return
        raise Decline("the main loop indexes messages other than at 0 or a neighbour")


def _is_first(node: jn.Node) -> bool:
    """`loop.first` or `loop.index0 == 0` (the guard before reading the previous message)."""
    if _is_loop_attr(node, "first"):
        return True
    return (isinstance(node, jn.Compare) and _is_loop_attr(node.expr, "index0") and len(node.ops) == 1
            and node.ops[0].op == "eq" and isinstance(node.ops[0].expr, jn.Const) and node.ops[0].expr.value == 0)


def _is_loop_attr(node: jn.Node, attr: str) -> bool:
    return isinstance(node, jn.Getattr) and isinstance(node.node, jn.Name) and node.node.name == "loop" \
        and node.attr == attr


# -- latched scans: PRE loops that stop having any effect once a namespace flag is false --------


def _namespaces(ast: jn.Template) -> frozenset[str]:
    """Names PRE binds to `namespace(...)` at the top level, and binds to nothing else anywhere."""
    made, other = set(), set()
    top = {id(n) for n in ast.body}
    for a in ast.find_all(jn.Assign):
        for t in _targets(a.target):
            if isinstance(t, jn.Name):
                is_ns = (id(a) in top and isinstance(a.node, jn.Call) and isinstance(a.node.node, jn.Name)
                         and a.node.node.name == "namespace" and t is a.target)
                (made if is_ns else other).add(t.name)
    for f in ast.find_all(jn.For):
        other.update(t.name for t in _targets(f.target) if isinstance(t, jn.Name))
    return frozenset(made - other)


def _latch(loop: jn.For, namespaces: frozenset[str]) -> tuple[str, str] | None:
    """(namespace, attribute) of a PRE loop whose iterations do nothing once `ns.attr` is false
    at an iteration's start, or None.

    Qwen3's scan for the last real user query is one: it walks every message from the end, but
    after the first match (which clears `ns.multi_step_tool`) each iteration only sets a variable
    of its own and tests `ns.multi_step_tool and ...`, which stops at its first operand. So a
    `break` when the flag is false at an iteration's start leaves the output and every variable
    after the loop as they were, and the scan costs the messages after the last query, not all of
    them. The clause, on the syntax tree: no else, filter or recursion; the body is one `if` with
    no elif or else whose test's leftmost `and` operand is `ns.attr`, and otherwise only
    assignments to plain names (never the namespace) of numbers that cannot fail (integers, loop
    counters, `messages | length`, + - * of those). Nothing in such an iteration can write the
    flag, print, or raise, so an iteration that starts with the flag false leaves it false."""
    if loop.else_ or loop.test is not None or loop.recursive:
        return None
    if any(t.name in namespaces for t in _targets(loop.target) if isinstance(t, jn.Name)):
        return None
    guarded = [n for n in loop.body if isinstance(n, jn.If)]
    if len(guarded) != 1 or guarded[0].elif_ or guarded[0].else_:
        return None
    flag = guarded[0].test
    while isinstance(flag, jn.And):
        flag = flag.left
    if not (isinstance(flag, jn.Getattr) and isinstance(flag.node, jn.Name) and flag.node.name in namespaces):
        return None
    for n in loop.body:
        if n is guarded[0]:
            continue
        if not (isinstance(n, jn.Assign) and isinstance(n.target, jn.Name) and n.target.name not in namespaces
                and n.target.name != "loop" and _sure_number(n.node)):
            return None
    return flag.node.name, flag.attr


_COUNTERS = frozenset({"index", "index0", "revindex", "revindex0", "length", "depth", "depth0"})


def _sure_number(node: jn.Node) -> bool:
    """Whether `node` is an integer whose evaluation cannot fail or touch anything."""
    if isinstance(node, jn.Const):
        return type(node.value) is int
    if isinstance(node, jn.Getattr):
        return isinstance(node.node, jn.Name) and node.node.name == "loop" and node.attr in _COUNTERS
    if isinstance(node, jn.Filter):
        return (node.name == "length" and _is_messages(node.node) and not node.args and not node.kwargs
                and node.dyn_args is None and node.dyn_kwargs is None)
    if isinstance(node, jn.Add | jn.Sub | jn.Mul):
        return _sure_number(node.left) and _sure_number(node.right)
    if isinstance(node, jn.Neg):
        return _sure_number(node.node)
    return False


def _latch_break(ns: str, attr: str, right: str) -> str:
    """The tags inserted right after a latched loop's `for` tag (`right`: its closing
    whitespace-control sign, carried by the last inserted tag)."""
    return "{% if not " + ns + "." + attr + " %}{% break %}{% endif " + right + "%}"


_MAIN_ITER = re.compile(r"\s*\w+\s+in\s+[\w\[\]:1 ]+\s*")   # for message in messages / messages[1:]
_PRE_ITER = re.compile(r"\s*\w+\s+in\s+[\w\[\]:1 -]+\s*")   # ... also messages[::-1]


def _loop_tags(tags: list[re.Match[str]], start: int, head: re.Pattern[str]
               ) -> tuple[re.Match[str], re.Match[str]] | None:
    """(the `for` tag, its `endfor` tag) of the first loop whose tag starts at or after `start`
    and whose head matches `head`."""
    opener = None
    depth = 0
    for t in tags:
        kind = t.group(2)
        if opener is None:
            if kind == "for" and t.start() >= start and head.fullmatch(t.group(3)):
                opener = t
                depth = 1
            continue
        if kind == "for":
            depth += 1
        elif kind == "endfor":
            depth -= 1
            if depth == 0:
                return opener, t
    return None


def _rewrite(source: str, main: jn.For, ast: jn.Template, pre_vars: tuple[str, ...],
             latches: dict[int, tuple[str, str]] | None = None) -> str:
    """The window form of `source` (module docstring), checked against the original syntax tree.
    `latches`: PRE loops (by id) that get a `break` once their flag is false (`_latch`); one
    whose tags cannot be placed surely is left as it is."""
    latches = latches or {}
    masked = _COMMENT.sub(lambda m: " " * len(m.group(0)), source)
    tags = list(_BLOCK.finditer(masked))
    found = _loop_tags(tags, _line_offset(source, main.lineno), _MAIN_ITER)
    if found is None:
        raise Decline("the main loop's tags could not be located in the source")
    opener, closer = found
    right = opener.group(4)
    left = closer.group(1)
    shown = "".join("{{ %s | rowgrove_v }}{{ rowgrove_vmark }}" % v for v in pre_vars)
    head = ("{% if loop.index0 >= rowgrove_from %}{{ rowgrove_mark }}"
            "{% if loop.index0 == rowgrove_from %}{{ rowgrove_vmark }}" + shown + "{% endif " + right + "%}")
    tail = "{%" + left + " endif %}"
    inserts = [(opener.end(), head), (closer.start(), tail)]
    placed: dict[int, tuple[str, str]] = {}
    for node in ast.body:
        if node is main:
            break
        flag = latches.get(id(node))
        found = _loop_tags(tags, _line_offset(source, node.lineno), _PRE_ITER) if flag is not None else None
        if found is not None and found[1].start() < opener.start():
            inserts.append((found[0].end(), _latch_break(*flag, found[0].group(4))))
            placed[id(node)] = flag
    window = source
    for at, text in sorted(inserts, reverse=True):
        window = window[:at] + text + window[at:]
    try:
        _check_rewrite(ast, main, window, placed)
    except Decline:
        if not placed:
            raise
        return _rewrite(source, main, ast, pre_vars)  # the window form without the breaks
    return window


def _line_offset(source: str, lineno: int) -> int:
    """Offset of the start of line `lineno` (1-based) in `source`."""
    at = 0
    for _ in range(lineno - 1):
        at = source.index("\n", at) + 1
    return at


def _check_rewrite(ast: jn.Template, main: jn.For, window: str,
                   latched: dict[int, tuple[str, str]] | None = None) -> None:
    new = _env().parse(window)
    if len(new.body) != len(ast.body):
        raise Decline("the rewrite changed the template's structure")
    for old_node, new_node in zip(ast.body, new.body, strict=True):
        flag = (latched or {}).get(id(old_node))
        if flag is not None:
            # the loop with `{% if not ns.attr %}{% break %}{% endif %}` first, and otherwise itself
            if not (isinstance(new_node, jn.For) and new_node.body and isinstance(new_node.body[0], jn.If)):
                raise Decline("the rewrite changed a latched loop")
            guard = new_node.body[0]
            test = guard.test
            if not (isinstance(test, jn.Not) and isinstance(test.node, jn.Getattr) and isinstance(test.node.node, jn.Name)
                    and (test.node.node.name, test.node.attr) == flag and guard.body == [jn.Break()]
                    and not guard.elif_ and not guard.else_):
                raise Decline("the rewrite changed a latched loop")
            if list(new_node.body[1:]) != list(old_node.body) or new_node.target != old_node.target \
                    or new_node.iter != old_node.iter or new_node.else_ != old_node.else_ \
                    or new_node.test != old_node.test or new_node.recursive != old_node.recursive:
                raise Decline("the rewrite changed a latched loop's body (whitespace control)")
        elif old_node is main:
            if not (isinstance(new_node, jn.For) and len(new_node.body) == 1 and isinstance(new_node.body[0], jn.If)):
                raise Decline("the rewrite changed the main loop")
            wrapped = new_node.body[0]
            inner = wrapped.body
            if len(inner) < 2 or not isinstance(inner[0], jn.Output) or not isinstance(inner[1], jn.If) \
                    or wrapped.elif_ or wrapped.else_:
                raise Decline("the rewrite changed the main loop")
            if list(inner[2:]) != list(old_node.body) or new_node.target != old_node.target \
                    or new_node.iter != old_node.iter:
                raise Decline("the rewrite changed the main loop's body (whitespace control)")
        elif new_node != old_node:
            raise Decline("the rewrite changed the template outside the main loop")


__all__ = ["MARK", "VMARK", "Window", "analyse"]
