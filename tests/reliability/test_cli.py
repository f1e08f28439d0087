"""The CLI tried as a new user would: every bad input gives one line on stderr naming the problem
and the fix, exit code 2, no traceback, and no file left behind (issue 10, the CLI part)."""

from __future__ import annotations

import importlib.metadata
import json
import socket
import sqlite3
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import rowgrove.engines
from rowgrove.cli import main
from rowgrove.ledger import Ledger


def one_line(err: str) -> str:
    """The single stderr line (asserting there is exactly one and no traceback)."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` with its bytes (None for folders): what a command left behind."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes()) for p in root.rglob("*")}


@pytest.fixture
def no_engine(monkeypatch):
    """Loading an engine fails the test: the checks under test must come before it."""
    def refuse(*a, **k):
        raise AssertionError("the engine was loaded before the ledger and port checks")

    monkeypatch.setattr(rowgrove.engines, "make_engine", refuse)


def _bad_ledger(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / ("ledger" if kind == "directory" else "ledger.db")
    if kind == "text":
        path.write_text("not a database\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "foreign":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        db.execute("INSERT INTO notes(body) VALUES ('mine')")
        db.commit()
        db.close()
    elif kind == "foreign-meta":  # a `meta` table of its own, no schema_version in it
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE meta (key TEXT, value TEXT)")
        db.commit()
        db.close()
    elif kind == "directory":
        path.mkdir()
    return path


WHY = {"text": "not an SQLite database", "empty": "it is empty",
       "foreign": "an SQLite database without rowgrove's tables",
       "foreign-meta": "its meta table has no schema_version", "directory": "it is a directory"}


# -- 1. a ledger that is not a rowgrove ledger -------------------------------------------------

@pytest.mark.parametrize("kind", ["text", "empty", "foreign", "foreign-meta", "directory", "missing"])
@pytest.mark.parametrize("command", ["rows", "show"])
def test_rows_and_show_refuse_what_is_not_a_ledger(tmp_path, capsys, command, kind):
    path = _bad_ledger(tmp_path, kind)
    before = tree(tmp_path)
    extra = ["--out", str(tmp_path / "rows.jsonl")] if command == "rows" else ["--rollout", "ro_x"]
    assert main([command, "--ledger", str(path), *extra]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rowgrove {command}: ") and str(path) in line
    if kind == "missing":
        assert "does not exist: pass the file `rowgrove serve --ledger` wrote" in line
    else:
        assert f"is not a rowgrove ledger ({WHY[kind]}" in line
        assert "pass the ledger file `rowgrove serve --ledger` wrote" in line
    assert tree(tmp_path) == before  # nothing written, not even SQLite's side files


@pytest.mark.parametrize("kind", ["text", "foreign", "foreign-meta", "directory"])
def test_serve_refuses_what_is_not_a_ledger_before_loading_the_engine(tmp_path, capsys, no_engine, kind):
    path = _bad_ledger(tmp_path, kind)
    before = tree(tmp_path)
    assert main(["serve", "--engine", "scripted", "--model", "tiny", "--ledger", str(path), "--port", "0"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rowgrove serve: {path} is not a rowgrove ledger ({WHY[kind]}")
    assert line.endswith("pass a ledger that `rowgrove serve --ledger` wrote, or a new path to start a new one")
    assert tree(tmp_path) == before  # a foreign database is not given rowgrove's tables, nor WAL mode


def test_a_writable_open_takes_an_empty_file_and_a_new_path_as_a_new_ledger(tmp_path):
    empty = _bad_ledger(tmp_path, "empty")
    for path in (empty, tmp_path / "sub" / "new.db"):
        with Ledger(path) as lg:
            lg.create_rollout("g")
        with Ledger(path, readonly=True) as lg:
            assert lg.count() == 1


# -- 2. config: malformed YAML, agent typos; nothing written ------------------------------------

# if a check under test were missing, these keep the run that follows short
SHORT = ["--steps", "0", "--set", "warmup_sft_steps=0", "--set", "eval_prompts=0"]


def test_train_refuses_malformed_yaml_naming_file_and_line(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("lr: 0.001\nagent:\n  compaction: keep_last_rounds\n   every_k: 2\n")
    out = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--out", str(out), *SHORT]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rowgrove train: config {cfg}, line 4, column") and "is not valid YAML" in line
    assert "fix the file there" in line
    assert not out.exists()


@pytest.mark.parametrize("where", ["yaml", "set"])
def test_train_refuses_an_unknown_agent_option_and_writes_nothing(tmp_path, capsys, where):
    out = tmp_path / "run"
    if where == "yaml":
        cfg = tmp_path / "typo.yaml"
        cfg.write_text("agent:\n  compaction: keep_last_rounds\n  keep_round: 1\n")
        argv = ["train", "--config", str(cfg), "--out", str(out), *SHORT]
    else:
        argv = ["train", "--set", "agent.keep_round=1", "--out", str(out), *SHORT]
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rowgrove train: unknown agent option 'keep_round' (did you mean keep_rounds?)")
    assert "known options are max_actions, max_resamples, compaction, keep_images, keep_rounds, every_k" in line
    assert not out.exists()  # no run directory, no config.json


def test_train_refuses_bad_agent_values_and_bad_set_yaml(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--set", "agent.keep_rounds=two", "--out", str(out), *SHORT]) == 2
    assert one_line(capsys.readouterr().err) == "rowgrove train: AgentConfig.keep_rounds is an integer, got 'two'"
    assert main(["train", "--set", "agent.compaction=[x", "--out", str(out), *SHORT]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rowgrove train: config field agent.compaction: '[x' is not valid YAML")
    assert main(["train", "--set", "env=nope", "--out", str(out), *SHORT]) == 2
    assert "unknown environment 'nope'" in one_line(capsys.readouterr().err)
    assert not out.exists()


def test_train_with_a_model_that_does_not_load_leaves_no_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", str(tmp_path / "no-model"), "--out", str(out), *SHORT]) == 2
    assert "is neither a tiny spec" in one_line(capsys.readouterr().err)
    assert not out.exists()


# -- 3. serve: the port --------------------------------------------------------------------------

@pytest.mark.parametrize("port, says", [("99999", "99999 is out of range: give a port in 0..65535"),
                                        ("-1", "-1 is out of range"), ("http", "'http' is not a port number")])
def test_serve_refuses_a_port_out_of_range(tmp_path, capsys, no_engine, port, says):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--ledger", str(tmp_path / "ledger.db"), "--port", port])
    assert exit_.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rowgrove serve: argument --port: {says}") and "rowgrove serve --help" in line
    assert tree(tmp_path) == {}


def test_serve_on_a_busy_port_says_so_in_one_line_and_creates_no_ledger(tmp_path, capsys, no_engine):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        ledger = tmp_path / "runs" / "ledger.db"
        assert main(["serve", "--ledger", str(ledger), "--port", str(port)]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"rowgrove serve: port {port} on 127.0.0.1 is in use: stop the other server or pass --port")
    assert tree(tmp_path) == {}


class _FakeEngine:
    tokenizer = None

    async def aclose(self) -> None:
        pass


def test_a_failed_start_removes_the_ledger_it_created_and_keeps_one_with_data(tmp_path, capsys, monkeypatch):
    import rowgrove.commands.serve as serve_cmd
    import rowgrove.gateway.server

    # the engine fails to load: the new ledger (and the folders made for it) go
    def no_model(*a, **k):
        raise rowgrove.InputError("model 'x' is nowhere: pass a model directory")

    monkeypatch.setattr(rowgrove.engines, "make_engine", no_model)
    new = tmp_path / "runs" / "a" / "ledger.db"
    assert main(["serve", "--ledger", str(new), "--port", "0"]) == 2
    assert one_line(capsys.readouterr().err) == "rowgrove serve: model 'x' is nowhere: pass a model directory"
    assert tree(tmp_path) == {}

    # uvicorn exits when it cannot bind (a port taken between the check and the bind)
    def cannot_bind(*a, **k):
        raise SystemExit(1)

    monkeypatch.setattr(rowgrove.engines, "make_engine", lambda *a, **k: _FakeEngine())
    monkeypatch.setattr(serve_cmd, "_say_model_format", lambda *a: None)
    monkeypatch.setattr(rowgrove.gateway.server, "serve", cannot_bind)
    assert main(["serve", "--ledger", str(new), "--port", "0"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rowgrove serve: the gateway did not start on 127.0.0.1:0")
    assert tree(tmp_path) == {}

    # a ledger that holds rollouts is never removed, even one this start created
    kept = tmp_path / "kept.db"

    def records_then_fails(engine, ledger, **k):
        ledger.create_rollout("g")
        raise SystemExit(1)

    monkeypatch.setattr(rowgrove.gateway.server, "serve", records_then_fails)
    assert main(["serve", "--ledger", str(kept), "--port", "0"]) == 2
    capsys.readouterr()
    with Ledger(kept, readonly=True) as lg:
        assert lg.count() == 1


# -- 4. rows says what it skipped; show tells resamples from rewrites ---------------------------

def _call(lg: Ledger, ro: str, prompt: list[int], sampled: list[int], parent: str | None = None,
          request_hash: str | None = None) -> str:
    """A completed call; its request hash stands for its messages (by default: its prompt)."""
    c = lg.begin_call(ro, parent_id=parent, prompt_ids=prompt, prompt_len=len(prompt),
                      request_hash=request_hash or f"h{prompt}")
    lg.complete_call(c.id, sampled_ids=sampled, logprobs=[-0.5] * len(sampled), finish_reason="stop",
                     summary_hash="s", response_hash="r", response=None)
    return c.id


def test_rows_says_how_many_open_rollouts_it_skipped(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    with Ledger(path) as lg:
        done = lg.create_rollout("g").id
        _call(lg, done, [1, 2], [3])
        lg.finish_rollout(done, None, 1.0)
        open_ids = sorted(lg.create_rollout("g").id for _ in range(2))
    out = tmp_path / "rows.jsonl"
    assert main(["rows", "--ledger", str(path), "--out", str(out), "--quiet"]) == 0
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rowgrove rows: skipped 2 open rollouts (")
    assert all(i in line for i in open_ids)
    assert line.endswith("they have no rows until finished (POST /v1/rollouts/ID/finish)")
    assert [json.loads(x)["rollout_id"] for x in out.read_text().splitlines()] == [done]
    # nothing open: nothing said on stderr
    with Ledger(path) as lg:
        for i in open_ids:
            lg.finish_rollout(i, None, 0.0)
    assert main(["rows", "--ledger", str(path), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_show_labels_a_resample_of_a_root_apart_from_a_rewrite(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    with Ledger(path) as lg:
        ro = lg.create_rollout("g").id
        c1 = _call(lg, ro, [1, 2, 3], [9])
        _call(lg, ro, [1, 2, 3], [8])            # c2: the first request sent again (a resample)
        c3 = _call(lg, ro, [1, 2, 3, 9, 4], [7])  # c3: a new context (a rewrite)
        _call(lg, ro, [5], [6], parent=c3)        # c4: continues c3
        _call(lg, ro, [1, 2, 3, 9, 4], [5])       # c5: c3's request sent again
        # c6: other messages that happen to render to c1's prompt ids: a rewrite, not a resample
        _call(lg, ro, [1, 2, 3], [4], request_hash="other messages")
        assert c1
    assert main(["show", "--ledger", str(path), "--rollout", ro]) == 0
    heads = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tree ")]
    assert heads == ["tree 1 (root c1)", "tree 2 (root c2) — a resample of c1", "tree 3 (root c3) — after a rewrite",
                     "tree 4 (root c5) — a resample of c3", "tree 5 (root c6) — after a rewrite"]
    svg = tmp_path / "forest.svg"
    assert main(["show", "--ledger", str(path), "--rollout", ro, "--out", str(svg)]) == 0
    labels = [t.text for t in ET.fromstring(svg.read_text()).iter("{http://www.w3.org/2000/svg}text")]
    assert labels.count("resample") == 2 and labels.count("rewrite") == 2


# -- 5. bench: --quick keeps committed results; missed goals are flagged -------------------------

FAKE_BENCH = '''
import json, sys
from pathlib import Path

HERE = Path(__file__).parent

def main(argv):
    (HERE / "argv.json").write_text(json.dumps(argv))
    (HERE / "results" / "fake.json").write_text("smoke figures")  # a bench that forgets --quick
    (HERE / "results" / "extra.json").write_text("new smoke file")
    return {"speed_ratio": 2.0,
            "goals": {"p50_ms": {"value": 3.25, "goal": "<= 1 ms", "met": False},
                      "rows_per_s": {"value": 9, "goal": ">= 5", "met": True}},
            "nested": {"stored_goal_met": True}}
'''


@pytest.fixture
def bench_dir(tmp_path):
    d = tmp_path / "bench"
    (d / "results").mkdir(parents=True)
    (d / "bench_fake.py").write_text(FAKE_BENCH)
    (d / "results" / "fake.json").write_text("measured figures")
    return d


def test_bench_quick_passes_quick_and_puts_committed_results_back(bench_dir, capsys):
    assert main(["bench", "--dir", str(bench_dir), "--quick"]) == 0  # smoke: a miss does not fail it
    out = capsys.readouterr().out
    assert json.loads((bench_dir / "argv.json").read_text()) == ["--quick"]
    assert (bench_dir / "results" / "fake.json").read_text() == "measured figures"
    assert not (bench_dir / "results" / "extra.json").exists()
    assert "put back extra.json, fake.json" in out or "put back fake.json, extra.json" in out
    assert "MISSED p50_ms: 3.25 (goal <= 1 ms) [--quick: not a measurement]" in out


def test_bench_flags_a_missed_goal_and_exits_1(bench_dir, capsys):
    assert main(["bench", "--dir", str(bench_dir)]) == 1
    captured = capsys.readouterr()
    assert json.loads((bench_dir / "argv.json").read_text()) == []
    assert "   MISSED p50_ms: 3.25 (goal <= 1 ms)\n" in captured.out
    assert "   MET rows_per_s: 9 (goal >= 5)\n" in captured.out
    assert "   MET nested.stored: goal met\n" in captured.out
    assert one_line(captured.err) == "rowgrove bench: 1 goal MISSED (see the lines above)"
    assert (bench_dir / "results" / "fake.json").read_text() == "smoke figures"  # a full run writes


def test_the_real_benches_write_no_results_on_quick():
    """Every bench/bench_*.py writes its results file only when not --quick (or to an explicit --out)."""
    import re

    for f in sorted((Path(__file__).resolve().parents[1] / "bench").glob("bench_*.py")):
        src = f.read_text()
        main_src = src[src.index("def main("):]
        for m in re.finditer(r"\n( *)\S.*\.write_text\(", main_src):
            before = main_src[:m.start()]
            guard = before[before.rfind("\n    if ") if "\n    if " in before else 0:]
            assert re.search(r"if (not (args\.quick|q)|\w+ is not None)", guard), f"{f.name} writes on --quick"


# -- 6. --version; help shows defaults ----------------------------------------------------------

def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"rowgrove {importlib.metadata.version('rowgrove')}\n"


def test_help_shows_defaults_but_not_secrets(capsys, monkeypatch):
    monkeypatch.setenv("ROWGROVE_ENGINE_API_KEY", "sk-secret-123")
    monkeypatch.setenv("ROWGROVE_ADMIN_KEY", "admin-secret-456")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: tiny)" in text and "(default: scripted)" in text and "(default: cpu)" in text
    assert "secret" not in text
    assert text.count("(default 8000)") == 1 and "(default: 8000)" not in text  # said once
    with pytest.raises(SystemExit):
        main(["rows", "--help"])
    assert "(default: False)" not in capsys.readouterr().out  # flags have no default worth saying


# -- a ledger that cannot be written; --out that cannot be ---------------------------------------


def _read_only_sqlite(monkeypatch) -> None:
    """Every writable SQLite open becomes what a read-only file gives a non-root user (the suite
    runs as root in CI, where chmod alone does not stop writes): SQLite's own
    "attempt to write a readonly database" at the first write."""
    import sqlite3
    from urllib.parse import quote

    import rowgrove.ledger.store as store

    real = sqlite3.connect

    def connect(path, *args, **kwargs):
        if kwargs.pop("uri", False):
            return real(path, *args, uri=True, **kwargs)
        return real(f"file:{quote(str(Path(path).resolve()))}?mode=ro", *args, uri=True, **kwargs)

    monkeypatch.setattr(store.sqlite3, "connect", connect)


def _ledger_with_a_rollout(path: Path) -> str:
    with Ledger(path) as lg:
        ro = lg.create_rollout("g").id
        _call(lg, ro, [1, 2], [3])
        lg.finish_rollout(ro, None, 1.0)
    return ro


def test_serve_on_a_read_only_ledger_is_one_line_before_the_engine_loads(tmp_path, capsys, no_engine, monkeypatch):
    path = tmp_path / "ledger.db"
    _ledger_with_a_rollout(path)
    before = tree(tmp_path)
    _read_only_sqlite(monkeypatch)
    assert main(["serve", "--engine", "scripted", "--model", "tiny", "--ledger", str(path), "--port", "0"]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"rowgrove serve: cannot write ledger {path} (attempt to write a readonly database)")
    assert "pass a ledger file you can write" in line
    after = {k: v for k, v in tree(tmp_path).items() if not k.endswith(("-shm", "-wal"))}
    assert after == before  # the ledger untouched (SQLite's side files come and go with a reader)


def test_rows_and_show_read_a_read_only_ledger(tmp_path, capsys, monkeypatch):
    path = tmp_path / "ledger.db"
    ro = _ledger_with_a_rollout(path)
    _read_only_sqlite(monkeypatch)
    out = tmp_path / "rows.jsonl"
    assert main(["rows", "--ledger", str(path), "--out", str(out), "--quiet"]) == 0
    assert [json.loads(x)["rollout_id"] for x in out.read_text().splitlines()] == [ro]
    assert main(["show", "--ledger", str(path), "--rollout", ro]) == 0


@pytest.mark.parametrize("out, says", [
    ("folder", "is a folder: name a file in it"),
    ("folder.parquet", "is a folder: name a file in it"),
    ("afile/rows.jsonl", "is a file, not a folder"),
    ("rows.csv", "name it *.parquet or *.jsonl"),
])
def test_rows_refuses_an_out_it_cannot_write_and_leaves_no_file(tmp_path, capsys, out, says):
    path = tmp_path / "ledger.db"
    _ledger_with_a_rollout(path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder.parquet").mkdir()
    (tmp_path / "afile").write_text("x")
    before = tree(tmp_path)
    assert main(["rows", "--ledger", str(path), "--out", str(tmp_path / out)]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("rowgrove rows: ") and says in line, line
    assert tree(tmp_path) == before


def test_rows_into_a_new_folder_writes_the_file_whole(tmp_path, capsys):
    path = tmp_path / "ledger.db"
    ro = _ledger_with_a_rollout(path)
    out = tmp_path / "new" / "deeper" / "rows.parquet"
    assert main(["rows", "--ledger", str(path), "--out", str(out), "--quiet"]) == 0
    from rowgrove.assemble import read_rows

    assert [r.rollout_id for r in read_rows(out)] == [ro]
    assert sorted(p.name for p in out.parent.iterdir()) == ["rows.parquet"]  # no temporary left
