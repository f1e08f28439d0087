"""Rows as a reader sees them: decoded text, with the trained spans (loss mask 1: the tokens the
engine sampled, trained once) marked, and the token ids of each span on demand.

A row is cut into runs of equal loss mask and each run is decoded on its own, so the marks fall
exactly on token boundaries (decoding a whole row and searching for the span's text could not
say which occurrence was trained). `rowgrove show --model` and the training report use these.

    terminal:  ⟦...⟧ around trained text, e.g.  <|im_start|>assistant\\n⟦add(3)<|im_end|>⟧\\n...
    HTML:      <mark class="trained"> around trained text; ids in a title and, on demand, below
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

import numpy as np

from rowgrove.types import Row

OPEN, CLOSE = "⟦", "⟧"
TEXT_LEGEND = f"{OPEN}…{CLOSE} trained (sampled by the engine, loss mask 1) · unmarked: prompt, template glue, tool output (not trained)"
ROWS_CSS = (".rowtext { white-space: pre-wrap; font-family: ui-monospace, Menlo, monospace; font-size: 12px; "
            "background: #f6f8fa; padding: 6px; border-radius: 4px; } "
            ".rowtext mark.trained { background: #ffd33d; color: #24292f; } "
            ".rowtext .ids { color: #57606a; font-size: 11px; } .rowlegend mark.trained { background: #ffd33d; }")
HTML_LEGEND = ('<p class="rowlegend"><mark class="trained">highlighted</mark> text is trained (the tokens the '
               "engine sampled, loss mask 1, each trained once); the rest is prompt, template glue and tool "
               "output, never trained. Hover a span for its token ids.</p>")


def row_runs(row: Row) -> list[tuple[bool, list[int]]]:
    """(trained, token ids) of each run of equal loss mask, in order; together they are the row."""
    ids = [int(t) for t in np.asarray(row.input_ids)]
    mask = np.asarray(row.loss_mask) != 0
    runs: list[tuple[bool, list[int]]] = []
    for t, m in zip(ids, mask.tolist(), strict=True):
        if runs and runs[-1][0] == m:
            runs[-1][1].append(t)
        else:
            runs.append((m, [t]))
    return runs


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def row_text(row: Row, tokenizer: Any, *, ids: bool = False) -> str:
    """The row decoded, trained runs between ⟦ and ⟧; with `ids`, each run's token ids follow it
    in braces."""
    out = []
    for trained, run in row_runs(row):
        text = _decode(tokenizer, run)
        shown = f"{OPEN}{text}{CLOSE}" if trained else text
        out.append(shown + (f"{{{','.join(map(str, run))}}}" if ids else ""))
    return "".join(out)


def row_html(row: Row, tokenizer: Any, *, ids: bool = False) -> str:
    """The row decoded as an HTML block (`<pre class="rowtext">`), trained runs in
    `<mark class="trained">`, every run's token ids in its title (and shown after it with `ids`)."""
    parts = []
    for trained, run in row_runs(row):
        text = escape(_decode(tokenizer, run))
        title = escape(",".join(map(str, run)))
        shown = f'<mark class="trained" title="{title}">{text}</mark>' if trained else f'<span title="{title}">{text}</span>'
        parts.append(shown + (f'<span class="ids">[{title}]</span>' if ids else ""))
    return f'<pre class="rowtext">{"".join(parts)}</pre>'


def rows_text(rows: Sequence[Row], tokenizer: Any, *, ids: bool = False) -> str:
    """Every row as `row_text`, under a heading line per row, then the legend."""
    lines = []
    for r in rows:
        trained = int(np.sum(np.asarray(r.loss_mask) != 0))
        lines.append(f"row {r.segment} · {len(r.input_ids)} tok · {trained} trained")
        lines.append(row_text(r, tokenizer, ids=ids))
    lines.append(f"legend: {TEXT_LEGEND}")
    return "\n".join(lines) + "\n"


def rows_html(rows: Sequence[Row], tokenizer: Any, *, ids: bool = False) -> str:
    """Every row as `row_html` with a caption per row, then the legend (styles included)."""
    blocks = []
    for r in rows:
        trained = int(np.sum(np.asarray(r.loss_mask) != 0))
        blocks.append(f"<div class=\"row\"><b>row {r.segment}</b> · {len(r.input_ids)} tokens · {trained} trained"
                      f"{row_html(r, tokenizer, ids=ids)}</div>")
    return f"<style>{ROWS_CSS}</style>{''.join(blocks)}{HTML_LEGEND}"
