"""`rowgrove rows` and `rowgrove show` on a stand-in ledger (seed 003's compacted rollout and its
uncompacted sibling), through the real CLI entry point."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest
from assemble_standin import assistant, write_rollout
from test_assemble_regression_lock import EVERY_2, NO_COMPACTION, record, steps

from rowgrove.assemble import read_calls, read_rows, rollout_rows
from rowgrove.assemble.picture import render_svg, render_text
from rowgrove.cli import main
from rowgrove.ledger import Ledger


@pytest.fixture
def seed_ledger(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path) as lg:
        write_rollout(lg, "g0", steps(EVERY_2), record(True), 1.0, rollout_id="g0_s")
        write_rollout(lg, "g0", steps(NO_COMPACTION), record(False), 0.0, rollout_id="g1_s", call_prefix="g1:")
        write_rollout(lg, "g1", [("x1", None, [1], [2], "hi")],
                      {"messages": [assistant("hi"), assistant("invented")]}, 1.0, rollout_id="bad",
                      call_prefix="b:")
        lg.create_rollout("g2", rollout_id="still-open")
    return path


@pytest.mark.parametrize("name", ["rows.parquet", "rows.jsonl"])
def test_rows_command_writes_rows_with_advantages(seed_ledger, tmp_path, capsys, name):
    out = tmp_path / name
    assert main(["rows", "--ledger", str(seed_ledger), "--out", str(out), "--estimator", "dr_grpo"]) == 0
    summary = capsys.readouterr().out
    assert "3 rollouts → 6 rows (2.00 per rollout)" in summary
    assert "1 invalid" in summary and "unmatched_message ×1" in summary
    rows = read_rows(out)
    assert [(r.rollout_id, r.segment) for r in rows] == [
        ("g0_s", 0), ("g0_s", 1), ("g0_s", 2), ("g0_s", 3), ("g1_s", 0), ("bad", 0)]
    assert [r.advantage for r in rows] == pytest.approx([0.5] * 4 + [-0.5, 0.0])
    assert [r.valid for r in rows] == [True] * 5 + [False]
    assert list(rows[3].input_ids) == [10, 11, 1009] and list(rows[3].loss_mask) == [0, 0, 1]
    assert np.asarray(rows[4].input_ids).dtype == np.int32


def test_rows_command_refuses_a_bad_suffix_and_a_missing_ledger(seed_ledger, tmp_path, capsys):
    assert main(["rows", "--ledger", str(seed_ledger), "--out", str(tmp_path / "rows.csv")]) == 2
    assert "*.parquet or *.jsonl" in capsys.readouterr().err
    assert main(["rows", "--ledger", str(tmp_path / "nope.db"), "--out", str(tmp_path / "r.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_show_text_draws_both_pictures_of_seed_003(seed_ledger, capsys):
    assert main(["show", "--ledger", str(seed_ledger), "--rollout", "g1_s"]) == 0
    text = capsys.readouterr().out
    tree = [line.split("  ", 2)[1] if line.startswith("  ") else line for line in text.splitlines()]
    assert "1 tree · 1 row · 2 rejected" in text
    assert [line for line in text.splitlines() if line.startswith("  ") and ("✗" in line or "◉" in line)] == [
        "  ├─ c4 ✗  +2 prompt, 1 sampled · rejected, never trained",
        "     ├─ c7 ✗  +2 prompt, 1 sampled · rejected, never trained",
        "        c9 ◉  +2 prompt, 1 sampled · accepted leaf, walked",
    ]
    assert "[10,11,1001,20,21,1002,30,31,1003,50,51,1005,60,61,1006,80,81,1008,90,91,1009]" in text
    assert "21 tok · 7 trained" in text and tree
    assert main(["show", "--ledger", str(seed_ledger), "--rollout", "g0_s"]) == 0
    text = capsys.readouterr().out
    assert "4 trees · 4 rows · 2 rejected" in text
    assert text.count("— after a rewrite") == 3
    for ids in ("[10,11,1001,20,21,1002]", "[10,11,1003,50,51,1005]", "[10,11,1006,80,81,1008]", "[10,11,1009]"):
        assert ids in text


def test_show_files(seed_ledger, tmp_path, capsys):
    for name in ("forest.svg", "forest.html", "forest.png"):
        assert main(["show", "--ledger", str(seed_ledger), "--rollout", "g0_s", "--out", str(tmp_path / name)]) == 0
    svg = (tmp_path / "forest.svg").read_text()
    root = ET.fromstring(svg)  # well-formed XML
    labels = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert {f"c{i}" for i in range(1, 10)} <= set(labels)
    assert labels.count("✗") == 2 and labels.count("rewrite") == 3
    assert (tmp_path / "forest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "forest.html").read_text()
    assert main(["show", "--ledger", str(seed_ledger), "--rollout", "g0_s", "--out", str(tmp_path / "f.gif")]) == 2
    assert main(["show", "--ledger", str(seed_ledger), "--rollout", "nope"]) == 2
    # an open rollout still draws (no record yet: the terminal chain it would give)
    assert main(["show", "--ledger", str(seed_ledger), "--rollout", "still-open"]) == 0


def test_pictures_embed_invalid_reasons(seed_ledger):
    with Ledger(seed_ledger, readonly=True) as lg:
        rr = rollout_rows(lg, "bad")
        calls = read_calls(lg, "bad")
    assert "INVALID: 1 assistant message(s) of the record match no call" in render_text(calls, rr)
    assert "INVALID" in render_svg(calls, rr)
