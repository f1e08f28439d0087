"""`rowgrove ls` (one line per rollout, with filters) and `rowgrove rows --group/--exclude-group`,
through the real CLI entry point on a stand-in ledger."""

from __future__ import annotations

import pytest
from assemble_standin import assistant, write_rollout
from test_assemble_regression_lock import EVERY_2, NO_COMPACTION, record, steps

from rowgrove.assemble import read_rows
from rowgrove.cli import main
from rowgrove.commands._select import group_filter
from rowgrove.ledger import Ledger


@pytest.fixture
def ledger_path(tmp_path):
    # s1-p0: g0_s compacted (4 rows, reward 1), g1_s not (1 row, reward 0); s1-p1: "bad" (invented
    # text, masked); eval-p0: one eval rollout; eval-p1: still open
    path = tmp_path / "ledger.db"
    with Ledger(path) as lg:
        write_rollout(lg, "s1-p0", steps(EVERY_2), record(True), 1.0, rollout_id="g0_s")
        write_rollout(lg, "s1-p0", steps(NO_COMPACTION), record(False), 0.0, rollout_id="g1_s", call_prefix="g1:")
        write_rollout(lg, "s1-p1", [("x1", None, [1], [2], "hi")],
                      {"messages": [assistant("hi"), assistant("invented")]}, 1.0, rollout_id="bad",
                      call_prefix="b:")
        write_rollout(lg, "eval-p0", [("e1", None, [1], [3], "yo")], {"messages": [assistant("yo")]}, 0.5,
                      rollout_id="ev", call_prefix="e:")
        lg.create_rollout("eval-p1", rollout_id="still-open")
    return path


def _table(out):
    lines = out.strip().splitlines()
    return [line.split() for line in lines[1:-1]], lines[0], lines[-1]


def test_ls_lists_every_rollout_with_its_columns(ledger_path, capsys):
    assert main(["ls", "--ledger", str(ledger_path)]) == 0
    rows, header, footer = _table(capsys.readouterr().out)
    assert header.split() == ["id", "group", "status", "reward", "calls", "roots", "rows", "mask", "reason"]
    assert footer == "5 of 5 rollouts"
    by_id = {r[0]: r for r in rows}
    # EVERY_2 compacts: 4 roots -> 4 rows; NO_COMPACTION is one tree (with 2 rejected calls) -> 1 row
    assert by_id["g0_s"][1:] == ["s1-p0", "finished", "1", by_id["g0_s"][4], "4", "4", "-"]
    assert by_id["g1_s"][5:7] == ["1", "1"]
    assert by_id["bad"][-1] == "unmatched_message"
    assert by_id["still-open"][2:4] == ["open", "-"]


def test_ls_filters_by_group_glob_status_and_validity(ledger_path, capsys):
    assert main(["ls", "--ledger", str(ledger_path), "--exclude-group", "eval-*"]) == 0
    rows, _, footer = _table(capsys.readouterr().out)
    assert [r[0] for r in rows] == ["g0_s", "g1_s", "bad"] and footer == "3 of 5 rollouts"
    assert main(["ls", "--ledger", str(ledger_path), "--group", "eval-*", "--status", "finished"]) == 0
    assert [r[0] for r in _table(capsys.readouterr().out)[0]] == ["ev"]
    assert main(["ls", "--ledger", str(ledger_path), "--invalid"]) == 0
    assert [r[0] for r in _table(capsys.readouterr().out)[0]] == ["bad"]


def test_rows_group_and_exclude_group_leave_whole_groups_out(ledger_path, tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    assert main(["rows", "--ledger", str(ledger_path), "--out", str(out), "--estimator", "dr_grpo",
                 "--exclude-group", "eval-*"]) == 0
    assert "3 rollouts → 6 rows" in capsys.readouterr().out
    rows = read_rows(out)
    assert {r.group_id for r in rows} == {"s1-p0", "s1-p1"}
    # s1-p0's baseline is unchanged by leaving eval out: +-0.5 as with every group kept
    assert [r.advantage for r in rows if r.group_id == "s1-p0"] == pytest.approx([0.5] * 4 + [-0.5])
    assert main(["rows", "--ledger", str(ledger_path), "--out", str(out), "--group", "eval-*"]) == 0
    assert [r.rollout_id for r in read_rows(out)] == ["ev"]


def test_group_filter_globs():
    keep = group_filter(["s*", "x"], ["s1-*"])
    assert [keep(g) for g in ["s2-p0", "s1-p0", "x", "xy", None]] == [True, False, True, False, False]
    assert group_filter(None, None)(None) and not group_filter(None, [""])(None)


def test_show_with_model_prints_rows_as_text_and_ids_on_demand(ledger_path, tmp_path, capsys):
    from rowgrove.model.load import load_tokenizer

    tok = load_tokenizer("tiny")
    # rollout "ev": prompt id 1, sampled id 3 -> one row "<1>⟦<3>⟧", with --ids "{1}" and "{3}" after
    assert main(["show", "--ledger", str(ledger_path), "--rollout", "ev", "--model", "tiny", "--ids"]) == 0
    out = capsys.readouterr().out
    text = out.split("rows as text:\n", 1)[1]
    assert f"{tok.decode([1])}{{1}}⟦{tok.decode([3])}⟧{{3}}" in text
    assert "legend: ⟦…⟧ trained" in text
    page = tmp_path / "ev.html"
    assert main(["show", "--ledger", str(ledger_path), "--rollout", "ev", "--model", "tiny", "--out", str(page)]) == 0
    assert '<mark class="trained" title="3">' in page.read_text()
    assert main(["show", "--ledger", str(ledger_path), "--rollout", "ev", "--ids"]) == 2
    assert "give --model too" in capsys.readouterr().err
