"""The run's closing line about real-template tests (tests/conftest.py): present, with the right
count, whenever tests skip because the real chat templates are missing; absent otherwise."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = '''
import pytest

def test_runs():
    assert True

def test_needs_a_template():
    pytest.skip("real chat templates not found in /x: a.jinja is missing")

@pytest.mark.parametrize("k", [1, 2])
def test_needs_two(k):
    pytest.skip("real chat templates not found in /x: b.jinja is missing")

def test_skips_for_something_else():
    pytest.skip("no GPU")
'''

WHOLE = '''
import pytest

pytest.skip("real chat templates not found in /x (set ROWGROVE_TEMPLATES)", allow_module_level=True)

def test_never_collected():
    assert False
'''


def _pytest(args: list[str], cwd: Path, templates: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROWGROVE_TEMPLATES=str(templates), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def _lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "real-template tests skipped" in line]


def test_the_line_counts_template_skips_and_only_them(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    shutil.copy(ROOT / "tests" / "realfiles.py", suite / "realfiles.py")  # the conftest's import
    (suite / "test_tiny.py").write_text(TINY)
    (suite / "test_whole.py").write_text(WHOLE)
    empty = tmp_path / "no-templates"
    empty.mkdir()
    r = _pytest(["-rs", str(suite)], tmp_path, empty)
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = _lines(r.stdout)
    assert line.startswith("4 real-template tests skipped (3 tests, 1 whole test module): ")
    assert f"not found in {empty}." in line and "scripts/fetch_templates.py --out DIR" in line
    assert "ROWGROVE_TEMPLATES=DIR" in line
    out = r.stdout.splitlines()
    assert out.index(line) > max(i for i, s in enumerate(out) if s.startswith("SKIPPED"))  # after the -r summary
    assert "1 passed, 5 skipped" in out[-1]
    # no template skip, no line
    (suite / "test_whole.py").unlink()
    r = _pytest([str(suite), "-k", "runs or else"], tmp_path, empty)
    assert r.returncode == 0 and not _lines(r.stdout), r.stdout


def test_the_real_suites_skips_are_counted(tmp_path):
    """The real modules' reasons are uniform: a module skipped whole (the model-family tests) and
    per-test skips (the parser round trips) both land in the count."""
    empty = tmp_path / "no-templates"
    empty.mkdir()
    r = _pytest(["tests/model/test_family.py", "tests/parsers/test_parsers_detect.py"], ROOT, empty)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (line,) = _lines(r.stdout)
    m = re.match(r"(\d+) real-template tests skipped \((\d+) tests, 1 whole test module\): ", line)
    assert m, line
    total, tests = int(m[1]), int(m[2])
    assert total == tests + 1 and tests >= 1
    # every skip of these two files is a template skip: the line counts them all
    assert re.search(rf"\b{total} skipped\b", r.stdout.splitlines()[-1]), r.stdout.splitlines()[-1]
    assert f"not found in {empty}." in line
