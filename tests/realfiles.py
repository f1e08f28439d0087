"""Files some tests need that the repository does not ship, and the one way a test reads them.

The real chat templates of the model families people train come from their model repositories
(`scripts/fetch_templates.py`); their licences keep them out of this repository. A fresh clone has
none, so every test that needs one must skip, not error. This module is the only place that
finds or opens such a file:

    template_text(file_name)       the template's text; skips the calling test when it is absent
    require_templates(file_names)  skips the calling test, or a whole module at import
                                   (`module=True`), unless every one is present
    templates_dir()                where they are looked for ($ROWGROVE_TEMPLATES, else
                                   <repo>/../shared/templates)

Every skip reason starts with `TEMPLATES_SKIP`, so the run's closing line (tests/conftest.py) can
count them and say how to get the files. `tests/test_realfiles_guard.py` fails when a test reads
the folder any other way, and `.ci/run` runs the modules that use these files once more with
none present (`scripts/check_fresh_clone.sh`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

TEMPLATES_SKIP = "real chat templates not found"


def templates_dir() -> Path:
    """The folder of real chat templates: $ROWGROVE_TEMPLATES, else <repo>/../shared/templates."""
    env = os.environ.get("ROWGROVE_TEMPLATES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "templates"


def _skip_text(missing: list[str]) -> str:
    folder = templates_dir()
    names = ", ".join(missing)
    return (f"{TEMPLATES_SKIP} in {folder}: {names} {'is' if len(missing) == 1 else 'are'} missing "
            "(set ROWGROVE_TEMPLATES to the templates folder; scripts/fetch_templates.py fetches them)")


def missing_templates(file_names: Iterable[str]) -> list[str]:
    """The names among `file_names` that the templates folder lacks (no test is skipped)."""
    folder = templates_dir()
    return [n for n in file_names if not (folder / n).is_file()]


def require_templates(file_names: Iterable[str], *, module: bool = False) -> None:
    """Skip the calling test (or, with `module=True`, the module being imported) unless every
    template in `file_names` is present."""
    missing = missing_templates(file_names)
    if missing:
        pytest.skip(_skip_text(missing), allow_module_level=module)


def template_text(file_name: str) -> str:
    """The text of the real template `file_name`; skips the calling test when it is absent."""
    require_templates([file_name])
    return (templates_dir() / file_name).read_text(encoding="utf-8")
