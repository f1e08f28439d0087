"""Where the trainers' environments are, and how a test that needs one skips or fails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def verl_python() -> Path:
    """The verl environment's python: $ROWGROVE_VERL_PYTHON, else .venv-stack-verl/bin/python
    (scripts/install_verl_env.sh: rowgrove[verl] with its dependencies beside verl)."""
    return Path(os.environ.get("ROWGROVE_VERL_PYTHON") or ROOT / ".venv-stack-verl" / "bin" / "python")


def require_or_skip(reason: str) -> None:
    """Skip with `reason` (a test, or a whole module when called at import), or fail when
    ROWGROVE_REQUIRE_TRAINERS=1 (make test sets it: there the trainer tests must run)."""
    if os.environ.get("ROWGROVE_REQUIRE_TRAINERS") == "1":
        pytest.fail(f"{reason} (ROWGROVE_REQUIRE_TRAINERS=1)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
