"""docs/integrations.md shows the files of examples/integrations/ verbatim, and they run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from rg_integration_env import ROOT, require_or_skip, verl_python

EXAMPLES = ROOT / "examples" / "integrations"
DOC = ROOT / "docs" / "integrations.md"


@pytest.mark.parametrize("name", ["verl_rows.py", "trl_gateway.py", "plain_shapes.py"])
def test_the_doc_holds_the_example_verbatim(name):
    assert (EXAMPLES / name).read_text() in DOC.read_text(), f"docs/integrations.md is out of date with {name}"


def run(python: str, name: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([python, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300, env=env,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_plain_example_runs():
    out = run(sys.executable, "plain_shapes.py")
    assert "slime rollout_id: [0, 0, 1] advantages: [0.7071, 0.7071, -0.7071]" in out
    assert "SkyRL is_last_step: [False, True, True]" in out


@pytest.mark.trainers
def test_trl_example_runs():
    try:
        import trl  # noqa: F401
    except ImportError:
        require_or_skip("TRL is not installed: pip install 'rowgrove[trl]'")
    out = run(sys.executable, "trl_gateway.py")
    assert "trained 2 steps; last step: 4 rollouts, 8 rows" in out
    norms = [float(x) for x in out.split("gradient norms [")[1].split("]")[0].split(",")]
    assert len(norms) == 2 and all(n > 0 for n in norms)
    syncs, gap = out.split("verified syncs: ")[1].split("; largest engine - trainer logprob gap ")
    assert int(syncs) == 3 and float(gap) <= 1e-3, out  # at the start and after each of the 2 steps


@pytest.mark.trainers
def test_verl_example_runs():
    py = verl_python()
    if not py.exists():
        require_or_skip(f"no verl environment at {py}: run scripts/install_verl_env.sh (or set ROWGROVE_VERL_PYTHON)")
    out = run(str(py), "verl_rows.py")
    assert "uid: ['q', 'q', 'q'] rollout_id: ['a', 'a', 'b']" in out and "config ok" in out
