"""The seam benchmark's page: one self-contained HTML file, every plot a base64 PNG inlined, each
with a caption and a legend written in the page's own text (the same colours as the lines).

Every plot shows rowgrove's line (wide, grey-black, drawn underneath so that a defect equal to it
stays visible) and each defect's that the figure applies to.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

COLORS = {
    "rowgrove": "#000000",
    "row_baseline": "#1f77b4",
    "reshape_groups": "#d62728",
    "row_divisor": "#2ca02c",
    "seq_mean_rows": "#9467bd",
    "retokenized": "#ff7f0e",
    "rejected_trained": "#8c564b",
}
ROWGROVE = ("rowgrove's seam (explicit groups, one reward and one weight per rollout, sampled ids only); "
            "the wide line underneath")


def _per_step(figures: Mapping[str, Sequence[Mapping[str, Any]]], defect: str, key: str) -> tuple[list[int], list[float]]:
    """(steps, the figure averaged over seeds at each step)."""
    by_step: dict[int, list[float]] = {}
    for per_seed in figures.values():
        for f in per_seed:
            v = f.get(defect, {}).get(key)
            if isinstance(v, (int, float)):
                by_step.setdefault(int(f["step"]), []).append(float(v))
    steps = sorted(by_step)
    return steps, [float(np.mean(by_step[s])) for s in steps]


def _by_rows(figures: Mapping[str, Sequence[Mapping[str, Any]]], defect: str) -> tuple[list[int], list[float]]:
    """(rows per rollout, mean relative weight of rollouts with that many rows over steps and seeds)."""
    acc: dict[int, list[float]] = {}
    for per_seed in figures.values():
        for f in per_seed:
            for k, v in f.get(defect, {}).get("relative_weight_by_rows", {}).items():
                acc.setdefault(int(k), []).append(float(v))
    xs = sorted(acc)
    return xs, [float(np.mean(acc[x])) for x in xs]


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return base64.b64encode(buf.getvalue()).decode()


def _plot(series: Sequence[tuple[str, Sequence[float], Sequence[float], Any]], xlabel: str, ylabel: str,
          title: str, *, bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None) -> str:
    """A line per (seam, xs, ys, style) in the seam's colour; axis labels and title always set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=90)
    for name, xs, ys, style in series:
        # rowgrove's line wide and underneath, so that a defect that equals it stays visible on top
        ref = name == "rowgrove"
        ax.plot(xs, ys, style or "-o", color=COLORS[name], markersize=3.5, linewidth=4 if ref else 1.4,
                alpha=0.45 if ref else 1.0, label=name, zorder=1 if ref else 2)
        if bands and name in bands:
            lo, hi = bands[name]
            ax.fill_between(xs, lo, hi, color=COLORS[name], alpha=0.12, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and row counts are whole numbers
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    data = _png(fig)
    plt.close(fig)
    return data


def _legend(series: Sequence[tuple[str, Any, Any, Any]], defects: Mapping[str, str]) -> str:
    items = []
    for name, *_ in series:
        text = ROWGROVE if name == "rowgrove" else defects[name]
        items.append(f'<li data-seam="{name}"><span class="swatch" style="background:{COLORS[name]}"></span>'
                     f"<b>{html.escape(name)}</b>: {html.escape(text)}</li>")
    return f'<ul class="legend">{"".join(items)}</ul>'


def figures_html(result: Mapping[str, Any]) -> list[tuple[str, str, str, list[tuple[str, Any, Any, Any]]]]:
    """(id, title, caption, series) of every plot, and the PNG as the last element of each."""
    figs = result["figures"]
    defects = result["defects"]
    out: list[Any] = []

    def steps_series(key: str, names: Sequence[str], ref_value: float) -> list[Any]:
        series = []
        for name in names:
            xs, ys = _per_step(figs, name, key)
            series.append((name, xs, ys, None))
        xs = series[0][1] if series else []
        return [("rowgrove", xs, [ref_value] * len(xs), "-")] + series

    all_defects = list(defects)
    out.append(("wrong-sign", "Rollouts whose advantage has the wrong sign", "Per step, averaged over seeds: the "
                "fraction of the step's rollouts whose signal (advantage x weight, summed over its rows) has a "
                "different sign (-1, 0, +1) from rowgrove's advantage, on the same rows. A uniform group that "
                "rowgrove gives exactly 0 and a defect makes non-zero counts as wrong.",
                steps_series("wrong_sign", all_defects, 0.0), ("step", "fraction of rollouts")))
    out.append(("mass", "Signal mass against rowgrove's", "Per step: sum over rollouts of |advantage x weight| "
                "under each seam, divided by the same sum under rowgrove's seam (1.0). Below 1 the step pushes "
                "less than it should; above 1 more.",
                steps_series("mass_ratio", all_defects, 1.0), ("step", "signal mass / rowgrove's")))
    rows_series = [("rowgrove", *_by_rows(figs, "row_divisor")[:1], [1.0] * len(_by_rows(figs, "row_divisor")[0]), "-")]
    rows_series += [(n, *_by_rows(figs, n), None) for n in all_defects]
    out.append(("weight-by-rows", "Per-rollout weight against rows per rollout", "Each rollout's share of the "
                "step's loss weight times the number of rollouts (1.0 is an equal share, rowgrove's under "
                "rollout-mean), averaged over the rollouts with that many rows, over steps and seeds.",
                rows_series, ("rows per rollout", "weight x rollouts")))
    out.append(("tokens", "Trained tokens never sampled (5) or rejected (6)", "Per step: trained tokens of the "
                "re-tokenized rows that the engine never sampled there (difflib alignment against the sampled "
                "ids), and trained tokens that belong to rejected (resampled) calls. rowgrove trains neither (0).",
                [("rowgrove", *_per_step(figs, "retokenized", "never_sampled_tokens")[:1],
                  [0.0] * len(_per_step(figs, "retokenized", "never_sampled_tokens")[0]), "-"),
                 ("retokenized", *_per_step(figs, "retokenized", "never_sampled_tokens"), None),
                 ("rejected_trained", *_per_step(figs, "rejected_trained", "rejected_tokens_trained"), None)],
                ("step", "tokens per step")))
    out.append(("logprob-gap", "Log-probability gap of re-tokenized text", "Per step, mean over trained spans "
                "(one call's sampled tokens): the engine's logprob of the sampled ids minus the policy's logprob "
                "of the re-tokenized ids of the same text, in nats (the policy holds the weights that sampled the "
                "step). rowgrove trains the sampled ids with the engine's logprobs: 0.",
                [("rowgrove", *_per_step(figs, "retokenized", "logprob_gap_per_span")[:1],
                  [0.0] * len(_per_step(figs, "retokenized", "logprob_gap_per_span")[0]), "-"),
                 ("retokenized", *_per_step(figs, "retokenized", "logprob_gap_per_span"), None)],
                ("step", "nats per span")))
    curves = result["curves"]
    series, bands = [], {}
    for name, per_seed in curves.items():
        r = np.asarray(list(per_seed.values()), np.float64)
        xs = list(range(1, r.shape[1] + 1))
        series.append((name, xs, r.mean(0).tolist(), None))
        bands[name] = (r.min(0).tolist(), r.max(0).tolist())
    out.append(("curves", "Learning curves: reward per step, each defect switched on alone", f"Mean reward of the "
                f"step's rollouts, averaged over {result['seeds']} seed(s) (band: lowest to highest seed). Every run "
                "starts from the same warmed model and samples step 1 with the same seeds, so step 1 is the same "
                "rollouts in every run; later steps differ only through the seam.",
                series, ("step", "reward (mean over rollouts)"), bands))
    reward = result.get("reward")
    if reward:
        series, bands = [], {}
        gseries, gbands = [], {}
        for name in curves:
            r = reward.get(name)
            if not r:
                continue
            xs = [int(st) for st in r["steps"]]
            by = [r["by_step"][str(st)] for st in xs]
            series.append((name, xs, [b["mean"] for b in by], None))
            if all(b["lo"] is not None for b in by):
                bands[name] = ([b["lo"] for b in by], [b["hi"] for b in by])
            gap = [r["gap_by_step"][str(st)] for st in xs]
            gseries.append((name, xs, [g["mean"] for g in gap], None))
            if name != "rowgrove" and all(g["lo"] is not None for g in gap):
                gbands[name] = ([g["lo"] for g in gap], [g["hi"] for g in gap])
        n = result["seeds"]
        out.append(("eval-curves", "Eval reward by step, each defect switched on alone", f"Mean reward on the "
                    f"held-out eval prompts (one rollout each, the same prompts and sampling seeds at every "
                    f"evaluation and in every arm), over {n} seeds; band: the 95% interval of the mean (Student's t "
                    "over seeds). Step 0 is the warmed model, the same in every arm.",
                    series, ("step", "eval reward"), bands))
        out.append(("eval-gaps", "Eval reward minus rowgrove's, seed by seed", f"Per step: the arm's eval reward "
                    f"minus rowgrove's on the same seed, averaged over {n} seeds; band: the 95% interval of that "
                    "paired difference. Where a band holds 0 the run measured no difference at that step.",
                    gseries, ("step", "eval reward - rowgrove's"), gbands))
    return out


def _ci(c: Mapping[str, Any] | None, signed: bool = False) -> str:
    """'0.612 [0.590, 0.634]' (or '+0.012 [...]' with `signed`); '–' without a value."""
    if not c or c.get("mean") is None:
        return "–"
    f = "{:+.3f}" if signed else "{:.3f}"
    if c.get("lo") is None:
        return f.format(c["mean"])
    return f"{f.format(c['mean'])} [{f.format(c['lo'])}, {f.format(c['hi'])}]"


def verdicts(result: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(defect, one plain sentence on its cost in final eval reward), for the long run's page."""
    reward = result.get("reward") or {}
    out = []
    for name in result["defects"]:
        r = reward.get(name)
        if not r:
            continue
        g, step = r["final_gap"], r["final_step"]
        if g.get("lo") is None:
            text = f"eval reward at step {step} differs from rowgrove's by {_ci(g, True)} (one seed: no interval)."
        elif g["verdict"] == "lower":
            text = (f"costs reward: at step {step} its eval reward is {_ci(g, True)} against rowgrove's "
                    f"(95% interval over {g['n']} seeds, below 0).")
        elif g["verdict"] == "higher":
            text = (f"scores higher than rowgrove's seam on this task: {_ci(g, True)} at step {step} "
                    f"(95% interval over {g['n']} seeds, above 0).")
        else:
            text = (f"no cost in reward measured on this task: {_ci(g, True)} at step {step}; the 95% "
                    f"interval over {g['n']} seeds holds 0 and rules out a cost larger than {-g['lo']:.3f}.")
        out.append((name, text))
    return out


def _table(result: Mapping[str, Any]) -> str:
    s = result["summary"]
    cols = [("wrong_sign", "wrong sign", "{:.1%}"), ("mass_ratio", "signal mass / rowgrove's", "{:.3f}"),
            ("weight_cv", "weight spread (cv)", "{:.3f}"), ("never_sampled_tokens", "never-sampled tokens / step", "{:.1f}"),
            ("rejected_tokens_trained", "rejected tokens / step", "{:.1f}"),
            ("logprob_gap_per_span", "logprob gap / span (nats)", "{:.3f}"),
            ("logprob_gap_per_changed_span", "logprob gap / changed span (nats)", "{:.2f}"),
            ("reward_last_step", "reward, last step", "{:.3f}"),
            ("reward_mean_last_3_steps", "reward, mean of the last 3 steps", "{:.3f}")]
    reward = result.get("reward") or {}
    extra = []
    if reward:
        any_arm = next(iter(v for k, v in reward.items() if isinstance(v, dict)), {})
        step = any_arm.get("final_step")
        extra = [f"eval reward, step {step} (95% CI)", f"minus rowgrove's, paired (95% CI)",
                 f"steps to eval {reward['threshold']:.2f} (seeds that reached it)"]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [*(c for _, c, _ in cols), *extra])
    body = []
    for name in ["rowgrove", *result["defects"]]:
        row = s.get(name, {})
        ref = {"wrong_sign": 0.0, "mass_ratio": 1.0, "weight_cv": 0.0, "never_sampled_tokens": 0.0,
               "rejected_tokens_trained": 0.0, "logprob_gap_per_span": 0.0} if name == "rowgrove" else {}
        cells = []
        for k, _, fmt in cols:
            v = row.get(k, ref.get(k))
            cells.append(f"<td>{fmt.format(v) if isinstance(v, (int, float)) else '–'}</td>")
        if reward:
            r = reward.get(name) or {}
            reach = r.get("steps_to_threshold_mean")
            cells += [f"<td>{_ci(r.get('final'))}</td>",
                      f"<td>{'0 (the reference)' if name == 'rowgrove' else _ci(r.get('final_gap'), True)}</td>",
                      f"<td>{f'{reach:.1f}' if reach is not None else 'not reached'} "
                      f"({html.escape(str(r.get('reached_threshold', '–')))})</td>"]
        body.append(f'<tr><th><span class="swatch" style="background:{COLORS[name]}"></span>{name}</th>{"".join(cells)}</tr>')
    return f"<table><tr><th>seam</th>{head}</tr>{''.join(body)}</table>"


def _design_html(result: Mapping[str, Any]) -> str:
    """What the long run measured reward on: sizes, evaluations, seeds, the threshold."""
    reward, c = result.get("reward"), result.get("config", {})
    if not reward:
        return ""
    return (f"<p>Reward: every arm trains {c.get('steps')} steps of {c.get('prompts_per_step')} prompts x "
            f"{c.get('rollouts_per_prompt')} rollouts and is evaluated after the warm-up (step 0) and every "
            f"{c.get('eval_every')} steps on {c.get('eval_prompts')} held-out prompts, one rollout each, the same "
            f"prompts and sampling seeds in every arm of a seed. Intervals are 95% Student's t over "
            f"{result['seeds']} seeds; a gap is the arm's eval reward minus rowgrove's on the same seed, so what "
            f"a seed's arms share (their prompts, the step-1 rollouts) cancels. Steps to reach: the first evaluation "
            f"at or above {reward['threshold']:.2f}, averaged over the seeds that reached it.</p>")


def _verdicts_html(result: Mapping[str, Any]) -> str:
    items = verdicts(result)
    if not items:
        return ""
    lis = "".join(f'<li data-verdict="{html.escape(n)}"><b>{html.escape(n)}</b>: {html.escape(t)}</li>' for n, t in items)
    return f"<h2>What each defect cost in reward</h2><ul>{lis}</ul>"


def write_page(result: Mapping[str, Any], path: str | Path) -> Path:
    """Write the page for a seam benchmark result (bench_seam.main's dict) to `path`."""
    parts = []
    for fid, title, caption, series, (xl, yl), *rest in figures_html(result):
        png = _plot(series, xl, yl, title, bands=rest[0] if rest else None)
        parts.append(f'<figure id="{fid}"><img alt="{html.escape(title)}" src="data:image/png;base64,{png}">'
                     f"<figcaption><b>{html.escape(title)}.</b> {html.escape(caption)}</figcaption>"
                     f"{_legend(series, result['defects'])}</figure>")
    cfg = html.escape(json.dumps(result["config"], indent=1, sort_keys=True))
    quick = " (--quick: a smoke run, not a measurement)" if result.get("quick") else ""
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>rowgrove bench seam</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 72em; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 2px 10px; border-bottom: 1px solid #ddd; }}
figure {{ margin: 1.5em 0; }} figcaption {{ max-width: 60em; }}
.legend {{ list-style: none; padding: 0; font-size: 13px; }}
.swatch {{ display: inline-block; width: 1.4em; height: 0.7em; margin-right: 0.5em; vertical-align: middle; }}
pre {{ background: #f6f6f6; padding: 8px; font-size: 12px; }}
</style></head><body>
<h1>What each known seam defect costs{html.escape(quick)}</h1>
<p>The demo task, the reference trainer, {result['seeds']} seed(s). At every step of rowgrove's run, on the
same captured rows, each defect is switched on alone and compared with rowgrove's seam; then the trainer
runs once per defect for the learning curves. Run time {result['seconds']:.0f} s
(<code>{html.escape(result['command'])}</code>). {html.escape(result.get('model', ''))}.</p>
{_design_html(result)}<h2>Headline (figures: means over steps and seeds; rewards: means over seeds)</h2>{_table(result)}
{_verdicts_html(result)}
<h2>Figures</h2>{''.join(parts)}
<h2>Config</h2><pre>{cfg}</pre>
</body></html>
"""
    p = Path(path)
    p.write_text(page)
    return p


if __name__ == "__main__":  # re-draw a page from a results file: python bench/seam_report.py seam.json seam.html
    import sys

    write_page(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
