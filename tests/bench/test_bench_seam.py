"""`rowgrove bench seam`: its page renders (every plot, caption and legend found by an HTML parse,
colours as drawn), and the figures path runs on rollouts captured by the real trainer (tiny
model, gateway, agent with compaction), small."""

from __future__ import annotations

import base64
from html.parser import HTMLParser

import pytest
import seam_defects as sd
from bench_seam import base_config, run_seam, summarize
from seam_report import COLORS, figures_html, write_page

from rowgrove.cli import main


class Page(HTMLParser):
    """Figures of the page: id, image bytes, caption text, legend entries (seam, swatch colour)."""

    def __init__(self):
        super().__init__()
        self.figures: list[dict] = []
        self.headers: list[str] = []
        self._caption = self._header = False
        self._li: dict | None = None
        self.text = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        fig = self.figures[-1] if self.figures else None
        if tag == "figure":
            self.figures.append({"id": a.get("id"), "png": b"", "caption": "", "legend": []})
        elif tag == "img" and fig is not None:
            src = a["src"]
            assert src.startswith("data:image/png;base64,")
            fig["png"] = base64.b64decode(src.split(",", 1)[1])
            fig["alt"] = a.get("alt")
        elif tag == "figcaption":
            self._caption = True
        elif tag == "li" and "data-seam" in a and fig is not None:
            self._li = {"seam": a["data-seam"], "color": None}
            fig["legend"].append(self._li)
        elif tag == "span" and self._li is not None and a.get("class") == "swatch":
            self._li["color"] = a["style"].split("background:")[1].strip()
        elif tag == "th":
            self._header = True

    def handle_endtag(self, tag):
        if tag == "figcaption":
            self._caption = False
        elif tag == "li":
            self._li = None
        elif tag == "th":
            self._header = False

    def handle_data(self, data):
        self.text += data
        if self._caption:
            self.figures[-1]["caption"] += data
        if self._header:
            self.headers.append(data)


def _result():
    # two steps of one seed, hand-made; curves for every seam
    step = {"rows_per_rollout": 2.0}
    for i, name in enumerate(sd.DEFECTS):
        step[name] = {"wrong_sign": 0.1 * i, "mass_ratio": 1 - 0.1 * i, "weight_cv": 0.0,
                      "relative_weight_by_rows": {"1": 1.0, "3": 0.5 + i}}
    step["retokenized"].update(never_sampled_tokens=4, logprob_gap_per_span=0.7)
    step["rejected_trained"].update(rejected_tokens_trained=9)
    figures = {"0": [{"step": 1, **step}, {"step": 2, **step}]}
    curves = {name: {"0": [0.1, 0.2, 0.3, 0.4], "1": [0.2, 0.2, 0.2, 0.5]} for name in sd.SEAMS}
    return {"figures": figures, "curves": curves, "defects": sd.DEFECTS, "seeds": 2, "seconds": 12.0,
            "command": "rowgrove bench seam", "config": {"lr": 0.001, "steps": 4}, "quick": False,
            "summary": summarize(figures, curves)}


def test_the_page_has_every_plot_with_caption_and_a_legend_in_its_colours(tmp_path):
    result = _result()
    page = Page()
    page.feed(write_page(result, tmp_path / "seam.html").read_text())
    expected = figures_html(result)
    assert [f["id"] for f in page.figures] == [e[0] for e in expected]
    assert len(page.figures) == 6
    for fig, (fid, title, caption, series, *_) in zip(page.figures, expected, strict=True):
        assert fig["png"].startswith(b"\x89PNG") and len(fig["png"]) > 5000, fid
        assert fig["alt"] == title and caption in " ".join(fig["caption"].split())
        # the legend names exactly the lines drawn, rowgrove's first, each in the colour it is drawn in
        assert [e["seam"] for e in fig["legend"]] == [s[0] for s in series]
        assert fig["legend"][0]["seam"] == "rowgrove"
        assert all(e["color"] == COLORS[e["seam"]] for e in fig["legend"])
    curves = page.figures[-1]
    assert [e["seam"] for e in curves["legend"]] == list(sd.SEAMS)
    # headline table: the last step is the last step; the mean of the last 3 steps is said so
    assert "reward, last step" in page.headers and "reward, mean of the last 3 steps" in page.headers
    assert result["summary"]["rowgrove"]["reward_last_step"] == pytest.approx(0.45)
    assert result["summary"]["rowgrove"]["reward_mean_last_3_steps"] == pytest.approx((0.2 + 0.3 + 0.4 + 0.2 + 0.2 + 0.5) / 6)
    assert '"lr": 0.001' in page.text and "Run time 12 s" in page.text


# the trainer tests' small run (tests/train/test_train_loop.py SMALL): the same warm-up, cached once
SMALL = dict(
    agent={"compaction": "keep_last_rounds", "every_k": 2, "max_resamples": 1, "max_actions": 4,
           "on_exhausted": "score"},
    prompts_per_step=2, rollouts_per_prompt=2, rollouts_per_minibatch=2, max_tokens=32,
    # 80 warm-up steps: every rollout has an accepted turn (a record with no assistant message
    # trains nothing, so a format-broken first action leaves a rollout without rows)
    warmup_sft_steps=80, warmup_sft_lr=1e-2, warmup_sft_batch=8, threads=1, concurrency=4,
)


@pytest.mark.slow
def test_quick_figures_on_captured_rollouts(tmp_path):
    import torch

    torch.set_num_threads(1)
    cfg = base_config(True, **SMALL, steps=1)
    figures: list[dict] = []
    recs = run_seam(cfg, "rowgrove", 0, tmp_path, figures)
    assert len(recs) == 1 and len(figures) == 1
    f = figures[0]
    counts = {int(k): v for k, v in f["rows_per_rollout_counts"].items()}
    R, N = sum(counts.values()), sum(k * v for k, v in counts.items())
    assert R == 4 and set(f) >= {"step", *sd.DEFECTS}
    for name in sd.DEFECTS:
        assert 0.0 <= f[name]["wrong_sign"] <= 1.0
    # the two weight defects follow from the row counts alone (rollout-mean; every row trains):
    # row divisor keeps R/N of the mass; seq-mean gives a k-row rollout k * R / N of an equal share
    if f["row_divisor"]["mass_ratio"] is not None:
        assert f["row_divisor"]["mass_ratio"] == pytest.approx(R / N)
    assert f["seq_mean_rows"]["relative_weight_by_rows"] == pytest.approx({k: k * R / N for k in counts})
    assert f["rejected_trained"]["rejected_tokens_trained"] >= 0
    assert f["retokenized"]["trained_tokens"] > 0
    result = {"figures": {"0": figures}, "curves": {"rowgrove": {"0": [r["reward_mean"] for r in recs]}},
              "defects": sd.DEFECTS, "seeds": 1, "seconds": 1.0, "command": "test", "config": cfg.to_dict(),
              "quick": True}
    result["summary"] = summarize(result["figures"], result["curves"])
    page = Page()
    page.feed(write_page(result, tmp_path / "seam.html").read_text())
    assert len(page.figures) == 6 and all(fig["png"] for fig in page.figures)


def test_bench_command_names_a_benchmark_and_passes_seeds_and_out(tmp_path, capsys):
    d = tmp_path / "bench"
    d.mkdir()
    (d / "bench_echo.py").write_text(
        "import json, sys\n"
        "def main(argv):\n"
        "    open(sys.argv[0] if False else __file__ + '.argv', 'w').write(json.dumps(argv))\n"
        "    return {'ok_ratio': 1.0}\n")
    (d / "bench_other.py").write_text("def main(argv):\n    return {}\n")
    assert main(["bench", "echo", "--dir", str(d), "--seeds", "3", "--out", str(tmp_path / "o"), "--quick"]) == 0
    assert (d / "bench_echo.py.argv").read_text() == f'["--quick", "--seeds", "3", "--out", "{tmp_path / "o"}"]'
    assert "== other" not in capsys.readouterr().out
    assert main(["bench", "--dir", str(d), "--seeds", "3"]) == 2
    assert "go to one benchmark" in capsys.readouterr().err
    assert main(["bench", "nope", "--dir", str(d)]) == 2
