"""The trainer's two rollout runners share their job pieces through rowgrove.train.jobs, and
neither imports the other (no import circle between train/loop.py and train/ray_rollouts.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import rowgrove.train.loop as loop
import rowgrove.train.ray_rollouts as ray_rollouts
from rowgrove.train import jobs

TRAIN = Path(jobs.__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_ray_rollouts_does_not_import_the_loop():
    assert "rowgrove.train.loop" not in _imported_modules(TRAIN / "ray_rollouts.py")


def test_jobs_imports_neither_runner():
    mods = _imported_modules(TRAIN / "jobs.py")
    assert not mods & {"rowgrove.train.loop", "rowgrove.train.ray_rollouts"}, mods


def test_both_runners_use_the_same_functions():
    assert loop._mix is jobs.mix is ray_rollouts.mix
    assert loop._agent_config is jobs.agent_config is ray_rollouts.agent_config


def test_mix_is_pinned():
    # Seeds of every recorded run depend on these values: a change re-seeds all rollouts.
    assert jobs.mix(0) == 4953163356653287321
    assert jobs.mix(1, 2, 3) == 2347502745480893085
    assert jobs.mix(0, 999_983) == 1236009402340590658
    assert jobs.mix(-1) == jobs.mix(2**64 - 1)  # parts are taken mod 2**64
