"""Lineage pictures: a rollout's calls as a forest (a tree per root), like NeMo RL PR #4124's figure.

Each call is drawn as `cN` (its ordinal). Continuations hang under their parent; a new root starts
a new tree: a resample when an earlier root was the same request (a first call sent again), else a
context rewrite. Rejected calls are marked ✗, accepted calls ●, the accepted
leaf each chain was walked from ◉, and the walked chain of every tree is highlighted. Under the
forest: the rows it gave, with their calls and token counts.

`render_text` draws with box-drawing characters for a terminal; `render_svg` builds a standalone
SVG by plain string building (no extra dependencies) that an HTML report can embed;
`render_html` wraps it in a page; `render_png` draws the same layout with matplotlib.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np

from rowgrove.assemble.build import RolloutRows
from rowgrove.errors import InputError
from rowgrove.types import Call, Row

MAX_TOKENS_SHOWN = 40


@dataclass
class Node:
    call: Call
    label: str
    kind: str        # "leaf" (accepted leaf, walked) | "accepted" | "rejected" | "failed" | "pending"
    walked: bool     # on a chain that gave a row
    x: int = 0       # column: position in ordinal order
    y: int = 0       # lane inside the forest


def _kinds(calls: list[Call], rr: RolloutRows) -> dict[str, Node]:
    accepted = set(rr.accepted)
    walked = {cid for ch in rr.chains for cid in ch}
    leaves = {ch[-1] for ch in rr.chains}
    nodes: dict[str, Node] = {}
    for c in calls:
        if c.status in ("failed", "aborted"):
            kind = "failed"
        elif c.status == "pending":
            kind = "pending"
        elif c.id in leaves:
            kind = "leaf"
        elif c.id in accepted:
            kind = "accepted"
        else:
            kind = "rejected"
        nodes[c.id] = Node(c, f"c{c.ordinal}", kind, c.id in walked)
    return nodes


def _children(
    calls: list[Call], nodes: dict[str, Node], *, walked_first: bool = False
) -> tuple[list[str], dict[str, list[str]]]:
    """Roots in ordinal order and each call's children by ordinal (walked children first when
    asked: the picture then draws each walked chain on one straight lane). A call whose parent is
    not in the list is drawn as a root."""
    roots: list[str] = []
    kids: dict[str, list[str]] = {c.id: [] for c in calls}
    for c in sorted(calls, key=lambda c: c.ordinal):
        if c.parent_id is None or c.parent_id not in kids:
            roots.append(c.id)
        else:
            kids[c.parent_id].append(c.id)
    for k in kids.values():
        k.sort(key=lambda i: (walked_first and not nodes[i].walked, nodes[i].call.ordinal))
    return roots, kids


def _new_trees(roots: list[str], nodes: dict[str, Node]) -> dict[str, str]:
    """Each root after the first: "resample of cN" when the earlier root cN was the same request
    (same messages, so the same request hash, and the same prompt ids) sent again, else "rewrite"
    (a new context)."""
    out: dict[str, str] = {}
    for t, root in enumerate(roots):
        if t:
            c = nodes[root].call
            same = next((nodes[r].label for r in roots[:t] if nodes[r].call.request_hash == c.request_hash
                         and np.array_equal(nodes[r].call.prompt_ids, c.prompt_ids)), None)
            out[root] = f"resample of {same}" if same else "rewrite"
    return out


def _note(n: Node) -> str:
    c = n.call
    parts = [f"+{len(c.prompt_ids)} prompt, {len(c.sampled_ids)} sampled"]
    if c.parent_id is None:
        parts.insert(0, "root")
    if n.kind == "leaf":
        parts.append("accepted leaf, walked")
    elif n.kind == "rejected":
        parts.append("rejected, never trained")
    elif n.kind in ("failed", "pending"):
        parts.append(f"{c.status}" + (f": {c.error}" if c.error else ""))
    return " · ".join(parts)


MARK = {"leaf": "◉", "accepted": "●", "rejected": "✗", "failed": "✗", "pending": "…"}


def _fmt_tokens(ids: np.ndarray) -> str:
    shown = ",".join(str(int(t)) for t in ids[:MAX_TOKENS_SHOWN])
    return f"[{shown}{', …' if len(ids) > MAX_TOKENS_SHOWN else ''}]"


def _row_lines(rows: list[Row], label: dict[str, str]) -> list[str]:
    out = []
    for r in rows:
        ids = np.asarray(r.input_ids)
        trained = int(np.sum(np.asarray(r.loss_mask)))
        adv = "" if r.advantage is None else f" · advantage {r.advantage:+.3g}"
        valid = "" if r.valid else " · INVALID"
        calls = " · ".join(label.get(c, c) for c in r.call_ids)
        reward = "none" if r.reward is None else f"{r.reward:.4g}"
        out.append(f"row {r.segment} · {calls} · {len(ids)} tok · {trained} trained · reward {reward}{adv}{valid}")
        out.append(f"    {_fmt_tokens(ids)}")
    return out


def _header(calls: list[Call], rr: RolloutRows, rows: list[Row]) -> list[str]:
    m = rr.metrics
    roots = sum(1 for c in calls if c.parent_id is None)
    head = [
        f"rollout {rr.rollout_id} · {len(calls)} calls · {roots} tree{'s' if roots != 1 else ''} · "
        f"{len(rows)} row{'s' if len(rows) != 1 else ''} · {m.get('rejected_calls', 0)} rejected"
    ]
    if rr.invalid_reason:
        head.append(f"INVALID: {rr.invalid_reason}")
    if m.get("note"):
        head.append(f"note: {m['note']}")
    return head


def image_labels(calls: list[Call], images: Mapping[str, Sequence[str]] | None) -> dict[str, str]:
    """A short label per image (`i1`, `i2`, ... in the order the calls first carried them) from
    `Ledger.call_images`: {call id: its prompt's image digests}."""
    out: dict[str, str] = {}
    for c in sorted(calls, key=lambda c: c.ordinal):
        for d in (images or {}).get(c.id, ()):
            out.setdefault(d, f"i{len(out) + 1}")
    return out


def _image_note(call: Call, images: Mapping[str, Sequence[str]] | None, labels: dict[str, str],
                seen: set[str]) -> str:
    """`images i1 +i2`: the images the call's prompt carried, `+` on those it carried first."""
    mine = list((images or {}).get(call.id, ()))
    if not mine:
        return ""
    parts = [("" if d in seen else "+") + labels[d] for d in mine]
    seen.update(mine)
    return "images " + " ".join(parts)


def _image_legend(labels: dict[str, str]) -> list[str]:
    return [f"images ({len(labels)}, + = first carried by that call): "
            + ", ".join(f"{lab} = {d[:19]}…" for d, lab in labels.items())] if labels else []


def render_text(calls: list[Call], rr: RolloutRows, rows: list[Row] | None = None, *,
                images: Mapping[str, Sequence[str]] | None = None) -> str:
    """A terminal drawing: a box-drawing tree per root (a call with one child continues on the
    same indent; branches fork with ├─ / └─), then the rows. `rows` defaults to `rr.rows` (pass
    rows with advantages to show them). `images` ({call id: image digests}, `Ledger.call_images`)
    adds which images each call carried."""
    rows = rr.rows if rows is None else rows
    labels = image_labels(calls, images)
    seen: set[str] = set()
    notes = {c.id: _image_note(c, images, labels, seen) for c in sorted(calls, key=lambda c: c.ordinal)}
    nodes = _kinds(calls, rr)
    roots, kids = _children(calls, nodes)
    new_trees = _new_trees(roots, nodes)
    lines = _header(calls, rr, rows)
    for t, root in enumerate(roots, 1):
        how = new_trees.get(root)
        lines.append(f"tree {t} (root c{nodes[root].call.ordinal})"
                     + ("" if how is None else " — after a rewrite" if how == "rewrite" else f" — a {how}"))
        # stack of (call id, prefix for its own line, prefix for its children)
        stack: list[tuple[str, str, str]] = [(root, "  ", "  ")]
        while stack:
            cid, own, below = stack.pop()
            n = nodes[cid]
            extra = f"  {notes[cid]}" if notes[cid] else ""
            lines.append(f"{own}{n.label} {MARK[n.kind]}  {_note(n)}{extra}")
            ch = kids[cid]
            if len(ch) == 1:
                stack.append((ch[0], below, below))
            else:
                for i in range(len(ch) - 1, -1, -1):
                    last = i == len(ch) - 1
                    stack.append((ch[i], below + ("└─ " if last else "├─ "), below + ("   " if last else "│  ")))
    label = {c.id: f"c{c.ordinal}" for c in calls}
    lines.append("rows:" if rows else "rows: none")
    lines.extend("  " + line for line in _row_lines(rows, label))
    lines.extend(_image_legend(labels))
    lines.append("legend: ◉ accepted leaf (walked up to its root) · ● accepted · ✗ rejected or failed · "
                 "… pending · cN = N-th call")
    return "\n".join(lines) + "\n"


def layout(
    calls: list[Call], rr: RolloutRows
) -> tuple[list[Node], list[tuple[Node, Node]], list[tuple[int, str]]]:
    """Nodes placed on a grid (x: ordinal order, y: lane), parent→child edges, and the x columns
    where a new tree starts, each with its label ("rewrite" or "resample")."""
    nodes = _kinds(calls, rr)
    roots, kids = _children(calls, nodes, walked_first=True)
    order = sorted(calls, key=lambda c: c.ordinal)
    for x, c in enumerate(order):
        nodes[c.id].x = x
    new_trees = _new_trees(roots, nodes)
    rewrites: list[tuple[int, str]] = []
    for root in roots:
        if root in new_trees:
            rewrites.append((nodes[root].x, new_trees[root].split()[0]))
        next_lane = 1
        stack = [(root, 0)]
        while stack:
            cid, lane = stack.pop()
            nodes[cid].y = lane
            ch = kids[cid]
            for i in range(len(ch) - 1, -1, -1):
                if i == 0:
                    stack.append((ch[i], lane))
                else:
                    stack.append((ch[i], next_lane))
                    next_lane += 1
    edges = [(nodes[c.parent_id], nodes[c.id]) for c in order if c.parent_id in nodes and c.id not in roots]
    return [nodes[c.id] for c in order], edges, rewrites


COLOR = {"leaf": "#1f6feb", "accepted": "#58a6ff", "rejected": "#9e9e9e", "failed": "#d73a49", "pending": "#e3b341"}


def render_svg(calls: list[Call], rr: RolloutRows, rows: list[Row] | None = None, *,
               images: Mapping[str, Sequence[str]] | None = None) -> str:
    """A standalone SVG of the forest and its rows (plain string building; embeddable in HTML).
    `images` ({call id: image digests}) labels each call with the images it carried."""
    rows = rr.rows if rows is None else rows
    labels = image_labels(calls, images)
    seen: set[str] = set()
    notes = {c.id: _image_note(c, images, labels, seen) for c in sorted(calls, key=lambda c: c.ordinal)}
    legend_images = _image_legend(labels)
    nodes, edges, rewrites = layout(calls, rr)
    dx, dy, pad, r = 56, 44, 30, 14
    lanes = max((n.y for n in nodes), default=0) + 1
    width = max(pad * 2 + dx * max(len(nodes), 1), 640)
    head = _header(calls, rr, rows)
    label = {c.id: f"c{c.ordinal}" for c in calls}
    row_lines = _row_lines(rows, label)
    top = pad + 18 * len(head) + 10
    forest_h = dy * lanes + 10
    height = top + forest_h + 18 * (len(row_lines) + 2 + len(legend_images)) + pad

    def at(n: Node) -> tuple[int, int]:
        return pad + dx * n.x + r, top + dy * n.y + r

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="ui-monospace, Menlo, monospace" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for i, line in enumerate(head):
        color = "#d73a49" if line.startswith("INVALID") else "#24292f"
        out.append(f'<text x="{pad}" y="{pad + 18 * i}" fill="{color}">{escape(line)}</text>')
    for x, what in rewrites:
        lx = pad + dx * x - (dx - 2 * r) // 2
        out.append(f'<line x1="{lx}" y1="{top - 8}" x2="{lx}" y2="{top + forest_h - 10}" stroke="#bbb" '
                   'stroke-dasharray="4 3"/>')
        out.append(f'<text x="{lx + 3}" y="{top - 10}" fill="#888" font-size="10">{what}</text>')
    for a, b in edges:
        (x1, y1), (x2, y2) = at(a), at(b)
        hot = a.walked and b.walked
        stroke = ' stroke="#1f6feb" stroke-width="3"' if hot else ' stroke="#aaa" stroke-width="1.5"'
        path = f"M{x1},{y1} L{x2},{y2}" if y1 == y2 else f"M{x1},{y1} C{x1 + dx // 2},{y1} {x2 - dx // 2},{y2} {x2},{y2}"
        out.append(f'<path d="{path}" fill="none"{stroke}/>')
    for n in nodes:
        cx, cy = at(n)
        fill = COLOR[n.kind]
        title = escape(f"{n.call.id}: {_note(n)}")
        shape = (f'<rect x="{cx - r}" y="{cy - r}" width="{2 * r}" height="{2 * r}" rx="4"'
                 if n.call.parent_id is None else f'<circle cx="{cx}" cy="{cy}" r="{r}"')
        ring = ' stroke="#0b3d91" stroke-width="3"' if n.kind == "leaf" else ' stroke="white" stroke-width="1"'
        out.append(f'<g><title>{title}</title>{shape} fill="{fill}"{ring}/>'
                   f'<text x="{cx}" y="{cy + 4}" text-anchor="middle" fill="white" font-size="11">{n.label}</text>')
        if n.kind in ("rejected", "failed"):
            out.append(f'<text x="{cx + r - 2}" y="{cy - r + 2}" fill="#d73a49" font-size="14">✗</text>')
        if notes[n.call.id]:
            out.append(f'<text x="{cx}" y="{cy + r + 11}" text-anchor="middle" fill="#8250df" font-size="9">'
                       f'{escape(notes[n.call.id][len("images "):])}</text>')
        out.append("</g>")
    y0 = top + forest_h + 14
    out.append(f'<text x="{pad}" y="{y0}" fill="#24292f" font-weight="bold">{"rows" if rows else "rows: none"}</text>')
    for i, line in enumerate(row_lines):
        out.append(f'<text x="{pad + 10}" y="{y0 + 18 * (i + 1)}" fill="{"#57606a" if line.startswith("    ") else "#24292f"}">'
                   f"{escape(line.strip())}</text>")
    legend = ("square = root · dark ring = accepted leaf (walked) · blue = accepted · grey ✗ = rejected · "
              "red ✗ = failed · yellow = pending · thick = walked chain · dashed = a new tree (rewrite or resample)")
    out.append(f'<text x="{pad}" y="{y0 + 18 * (len(row_lines) + 1)}" fill="#888" font-size="10">{escape(legend)}</text>')
    for i, line in enumerate(legend_images):
        out.append(f'<text x="{pad}" y="{y0 + 18 * (len(row_lines) + 2 + i)}" fill="#8250df" font-size="10">'
                   f"{escape(line)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_html(calls: list[Call], rr: RolloutRows, rows: list[Row] | None = None, *,
                images: Mapping[str, Sequence[str]] | None = None) -> str:
    """A standalone HTML page with the SVG embedded."""
    return (
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>rowgrove · lineage of {escape(rr.rollout_id)}</title></head>\n"
        f"<body style=\"margin:16px\">\n{render_svg(calls, rr, rows, images=images)}</body></html>\n"
    )


def render_png(calls: list[Call], rr: RolloutRows, path: str | Path, rows: list[Row] | None = None) -> Path:
    """The same layout drawn with matplotlib (Agg) into a PNG file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = rr.rows if rows is None else rows
    nodes, edges, rewrites = layout(calls, rr)
    label = {c.id: f"c{c.ordinal}" for c in calls}
    text = _header(calls, rr, rows) + [""] + _row_lines(rows, label)
    lanes = max((n.y for n in nodes), default=0) + 1
    fig_w = max(6.0, 0.6 * len(nodes) + 1)
    fig_h = 0.6 * lanes + 0.22 * len(text) + 1
    fig, ax = plt.subplots(figsize=(min(fig_w, 60), min(fig_h, 60)))
    ax.set_axis_off()
    for x, _ in rewrites:
        ax.plot([x - 0.5, x - 0.5], [0.6, -lanes + 0.4], color="#bbb", linestyle="--", linewidth=1)
    for a, b in edges:
        hot = a.walked and b.walked
        ax.plot([a.x, b.x], [-a.y, -b.y], color="#1f6feb" if hot else "#aaa", linewidth=3 if hot else 1.5, zorder=1)
    for n in nodes:
        ax.scatter([n.x], [-n.y], s=420, marker="s" if n.call.parent_id is None else "o", color=COLOR[n.kind],
                   edgecolors="#0b3d91" if n.kind == "leaf" else "white", linewidths=2.5, zorder=2)
        ax.text(n.x, -n.y, n.label + (" ✗" if n.kind in ("rejected", "failed") else ""), ha="center",
                va="center", color="white", fontsize=7, zorder=3)
    ax.set_xlim(-1, max(len(nodes), 1))
    ax.set_ylim(-lanes - 0.22 * len(text) * 2, 1)
    ax.text(-0.8, -lanes, "\n".join(text), va="top", ha="left", family="monospace", fontsize=7)
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def write_picture(calls: list[Call], rr: RolloutRows, path: str | Path, rows: list[Row] | None = None, *,
                  images: Mapping[str, Sequence[str]] | None = None) -> Path:
    """Write the picture to `path`, the format chosen by its suffix: .svg, .html or .png
    (`images`, which calls carried which images, is drawn in .svg and .html)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".svg":
        path.write_text(render_svg(calls, rr, rows, images=images), encoding="utf-8")
    elif suffix in (".html", ".htm"):
        path.write_text(render_html(calls, rr, rows, images=images), encoding="utf-8")
    elif suffix == ".png":
        render_png(calls, rr, path, rows)
    else:
        raise InputError(f"{path}: cannot draw a picture of type {suffix or '(none)'!r}: name it *.svg, *.html or *.png")
    return path
