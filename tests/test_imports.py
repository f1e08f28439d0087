"""The package's layout is its data flow, with no arrow running back up: no module of src/rowgrove
imports a module that imports it back (directly or through others), and no
module grows past a size a reader can hold.

The import graph is read from the syntax tree of every module: every `import` and `from ...
import` statement, at module level or deferred inside a function (a deferred import still runs
an arrow back up the data flow; only those under `if TYPE_CHECKING:`, annotations, do not
count). An import names the most
specific module that exists (`from rowgrove.gateway.core import decide` is an edge to
rowgrove/gateway/core/decide.py, `from rowgrove.errors import X` to rowgrove/errors.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 650  # "a few hundred lines"; the gateway's largest modules sit near 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "rowgrove").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of the module but those under `if TYPE_CHECKING:`."""
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for stmt in node.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in skip]


def import_graph() -> dict[str, set[str]]:
    """module -> the rowgrove modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and t.startswith("rowgrove"):
                    graph[name].add(t)
                    break
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_the_graph_reader_sees_edges_and_circles():
    graph = import_graph()
    assert "rowgrove.errors" in graph["rowgrove.gateway.core.decide"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_src():
    found = cycles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_gateway_modules_stay_readable():
    """No module of the gateway grows past MAX_LINES (split it along the data flow instead)."""
    big = {str(p.relative_to(SRC)): n for p in (SRC / "rowgrove" / "gateway").rglob("*.py")
           if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_the_gateway_core_reads_images_only_as_the_edge_resolved_them():
    """A request's images are resolved to pixel digests once, at the edge, before `decide`; the
    decision and rendering core (`rowgrove.gateway.core`) works on that and never imports the
    image or media code, whose re-walks of `messages` would mean the normalisation leaked."""
    graph = import_graph()
    core = {m: deps for m, deps in graph.items() if m == "rowgrove.gateway.core" or m.startswith("rowgrove.gateway.core.")}
    assert core, "no rowgrove.gateway.core modules found"
    leaks = {m: sorted(d & {"rowgrove.gateway.images", "rowgrove.media"}) for m, d in core.items()}
    leaks = {m: d for m, d in leaks.items() if d}
    assert not leaks, f"the core reaches back into image/media code: {leaks}"
