"""What a run leaves for a reader: metrics.jsonl (one JSON object per step), PNG plots of the
curves, and report.html, a self-contained page (images base64-embedded, no server needed) with
the curves, a summary table and the lineage pictures of a few rollouts.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# (metric key, plot title) in the order the report shows them.
PLOTS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward (mean over rollouts)"),
    ("reward_std", "reward std"),
    ("rows_per_rollout", "rows per rollout"),
    ("roots_per_rollout", "roots per rollout"),
    ("rejected_calls", "rejected calls"),
    ("invalid_rollouts", "invalid rollouts"),
    ("tokens_generated", "tokens generated"),
    ("tokens_trained", "tokens trained"),
    ("clip_fraction", "clip fraction"),
    ("approx_kl", "approx KL (engine || policy)"),
    ("entropy", "entropy (nats/token)"),
    ("step_time", "step time (s)"),
)


def append_metrics(run_dir: str | Path, record: Mapping[str, Any]) -> None:
    """Append one step's metrics as a JSON line to RUN_DIR/metrics.jsonl."""
    with open(Path(run_dir) / "metrics.jsonl", "a") as f:
        f.write(json.dumps(dict(record), sort_keys=True) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every step record of RUN_DIR/metrics.jsonl (empty when there is none), one per step:
    a step written twice (a run resumed from an earlier checkpoint) keeps its last record."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_step[int(rec["step"])] = rec
    return [by_step[k] for k in sorted(by_step)]


def truncate_metrics(run_dir: str | Path, last_step: int) -> None:
    """Drop records after `last_step` (a resumed run rewrites the steps after its checkpoint)."""
    keep = [r for r in read_metrics(run_dir) if r["step"] <= last_step]
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))


def write_plots(run_dir: str | Path, records: Sequence[Mapping[str, Any]]) -> list[Path]:
    """One PNG per metric in PLOTS that the records carry, under RUN_DIR/plots/; plus
    curves.png with all of them on one grid. Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    keys = [(k, t) for k, t in PLOTS if any(k in r for r in records)]
    paths = []
    steps = [r["step"] for r in records]
    for key, title in keys:
        fig, ax = plt.subplots(figsize=(4.2, 2.8), dpi=90)
        ax.plot(steps, [r.get(key, float("nan")) for r in records], marker="o", markersize=3)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        p = out / f"{key}.png"
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    if keys:
        cols = 3
        rows = -(-len(keys) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(12, 2.6 * rows), dpi=80, squeeze=False)
        for ax, (key, title) in zip(axes.flat, keys, strict=False):
            ax.plot(steps, [r.get(key, float("nan")) for r in records], marker="o", markersize=2)
            ax.set_title(title, fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        fig.tight_layout()
        p = out / "curves.png"
        fig.savefig(p)
        plt.close(fig)
        paths.append(p)
    return paths


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def write_report(run_dir: str | Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                 *, config: Mapping[str, Any] | None = None, lineages: Sequence[tuple[str, str]] = ()) -> Path:
    """Write RUN_DIR/report.html: summary table, every curve (PNG embedded), the lineage SVGs
    given as (title, svg text), and the config. Returns its path."""
    run = Path(run_dir)
    plots = [p for p in write_plots(run, records) if p.name != "curves.png"]
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in summary.items())
    imgs = "".join(f"<figure>{_img(p)}</figure>" for p in plots)
    lin = "".join(f"<figure class=lineage><figcaption>{html.escape(t)}</figcaption>{svg}</figure>"
                  for t, svg in lineages) or "<p>(no lineage pictures)</p>"
    cfg = html.escape(json.dumps(dict(config or {}), indent=2, sort_keys=True, default=str))
    last = html.escape(json.dumps(dict(records[-1]), indent=2, sort_keys=True)) if records else "{}"
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rowgrove run {html.escape(run.name)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 2px 12px; border-bottom: 1px solid #ddd; }}
figure {{ display: inline-block; margin: 4px; }} .lineage {{ display: block; overflow-x: auto; }}
pre {{ background: #f6f6f6; padding: 8px; font-size: 12px; }}
</style></head><body>
<h1>rowgrove run: {html.escape(run.name)}</h1>
<h2>Summary</h2><table>{rows}</table>
<h2>Curves</h2>{imgs}
<h2>Lineage of a few rollouts (last step)</h2>{lin}
<h2>Last step</h2><pre>{last}</pre>
<h2>Config</h2><pre>{cfg}</pre>
</body></html>
"""
    path = run / "report.html"
    path.write_text(page)
    return path


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
