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
    ("ref_kl", "KL to the starting policy (k3, ref_kl)"),
    ("entropy", "entropy (nats/token)"),
    ("lr", "learning rate (after the step)"),
    ("compactions", "compactions per rollout"),
    ("step_time", "step time (s)"),
)
# The y-axis label of each plot (the x axis is always "step").
YLABELS: dict[str, str] = {
    "reward_mean": "reward", "reward_std": "reward std", "rows_per_rollout": "rows / rollout",
    "roots_per_rollout": "roots / rollout", "rejected_calls": "calls", "invalid_rollouts": "rollouts",
    "tokens_generated": "tokens", "tokens_trained": "tokens", "clip_fraction": "fraction of tokens",
    "approx_kl": "nats / token", "ref_kl": "nats / token", "entropy": "nats / token", "lr": "learning rate",
    "compactions": "compactions / rollout", "step_time": "seconds",
}


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
        ax.set_ylabel(YLABELS.get(key, title), fontsize=8)
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
            ax.set_xlabel("step", fontsize=7)
            ax.set_ylabel(YLABELS.get(key, title), fontsize=7)
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


def choose_examples(rewards: Sequence[float], n_rows: Sequence[int], k: int = 4) -> list[int]:
    """Indices of up to `k` rollouts to show, spread across rewards and row counts (not only the
    most rows): the highest and the lowest reward, each with its most and its fewest rows, then
    the most rows overall, then a median reward; no index twice, in that order."""
    n = len(rewards)
    picks: list[int] = []

    def add(i: int) -> None:
        if i not in picks and len(picks) < k:
            picks.append(i)

    if n == 0:
        return picks
    for target in (max(rewards), min(rewards)):
        same = [i for i in range(n) if rewards[i] == target]
        add(max(same, key=lambda i: (n_rows[i], -i)))
        add(min(same, key=lambda i: (n_rows[i], i)))
    add(max(range(n), key=lambda i: (n_rows[i], -i)))
    by_reward = sorted(range(n), key=lambda i: (rewards[i], i))
    add(by_reward[n // 2])
    for i in sorted(range(n), key=lambda i: (-n_rows[i], i)):
        add(i)
    return picks


def eval_points(before: float | None, after: float | None, steps: int,
                records: Sequence[Mapping[str, Any]] = ()) -> list[tuple[int, float]]:
    """(step, eval reward) in step order: after the warm-up (step 0), after every step the run
    evaluated (`eval_every`: the records' `eval_reward`), after GRPO (step `steps`)."""
    pts = {int(r["step"]): float(r["eval_reward"]) for r in records if r.get("eval_reward") is not None}
    if before is not None:
        pts[0] = float(before)
    if after is not None:
        pts[steps] = float(after)
    return sorted(pts.items())


def write_eval_plot(run_dir: str | Path, before: float | None, after: float | None, steps: int,
                    records: Sequence[Mapping[str, Any]] = ()) -> Path | None:
    """RUN_DIR/plots/eval_reward.png: the eval reward after the warm-up (step 0), at the steps
    the run evaluated between (`eval_every`) and after GRPO (step `steps`), the same prompts, one
    rollout each; None when the run did not evaluate."""
    pts = eval_points(before, after, steps, records)
    if not pts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.2, 2.8), dpi=90)
    ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color="#1f6feb")
    for x, y in pts if len(pts) <= 4 else (pts[0], pts[-1]):  # every label where they fit
        ax.annotate(f"{y:.3f}", (x, y), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    between = ", every evaluated step" if len(pts) > 2 else ""
    ax.set_title(f"eval reward: after warm-up (step 0){between}, after GRPO", fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.set_ylabel("eval reward (mean over prompts)", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(run_dir) / "plots" / "eval_reward.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def lineage_legend() -> str:
    """The lineage pictures' legend as HTML, every mark with its colour from the picture's own table."""
    from rowgrove.assemble.picture import COLOR

    def sw(color: str, shape: str = "border-radius: 50%") -> str:
        return f'<span style="display:inline-block;width:12px;height:12px;background:{color};{shape};vertical-align:middle"></span>'

    items = [
        f"{sw(COLOR['accepted'], 'border-radius: 2px')} square: a root (full prompt stored); circle: a continuation",
        f"{sw(COLOR['leaf'])} <span style='outline:2px solid #0b3d91'>dark ring</span>: accepted leaf, a chain walked from it to its root (one row)",
        f"{sw(COLOR['accepted'])} accepted call", f"{sw(COLOR['rejected'])} ✗ rejected call (resampled; never trained)",
        f"{sw(COLOR['failed'])} ✗ failed or aborted call", f"{sw(COLOR['pending'])} pending call",
        "<b style='color:#1f6feb'>thick blue edge</b>: the walked chain; grey edge: a continuation not walked",
        "dashed line: a new tree starts (\"rewrite\": the context was rewritten; \"resample\": a first call sent again)",
    ]
    return '<ul class="legend">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def write_report(run_dir: str | Path, records: Sequence[Mapping[str, Any]], summary: Mapping[str, Any],
                 *, config: Mapping[str, Any] | None = None, lineages: Sequence[tuple[str, str]] = (),
                 evals: tuple[float | None, float | None] = (None, None)) -> Path:
    """Write RUN_DIR/report.html: summary table, every curve (PNG embedded, axes labelled), the
    eval reward before and after GRPO (`evals`), the lineage pictures given as (title, svg or
    HTML) with their legend, and the config. Returns its path."""
    run = Path(run_dir)
    plots = [p for p in write_plots(run, records) if p.name != "curves.png"]
    eval_plot = write_eval_plot(run, *evals, steps=len(records), records=records)
    plots = ([eval_plot] if eval_plot else []) + plots
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
.legend {{ list-style: none; padding: 0; font-size: 13px; }}
pre {{ background: #f6f6f6; padding: 8px; font-size: 12px; }}
</style></head><body>
<h1>rowgrove run: {html.escape(run.name)}</h1>
<h2>Summary</h2><table>{rows}</table>
<h2>Curves</h2>{imgs}
<h2>Lineage of a few rollouts (last step, chosen across rewards and row counts)</h2>{lineage_legend()}{lin}
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
