"""Suite-wide: one line at the end of a run saying how many real-template tests were skipped.

The conformance matrix, the model-family, parser and agent-framework tests run on the families'
real chat templates, read only through tests/realfiles.py. Without them those tests skip, every
one with a reason that starts with `TEMPLATES_SKIP`, so a run can count them and say how to get
the templates (scripts/fetch_templates.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from realfiles import TEMPLATES_SKIP, templates_dir


def _skip_reason(report: Any) -> str:
    """The reason text of a skip report ("Skipped: " removed), "" when it has none."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return ""


def templates_skip_line(reports: list[Any], folder: str) -> str | None:
    """The summary line for the skip reports whose reason is the missing templates, None when
    there are none. A module skipped whole counts once (pytest collects none of its tests)."""
    hits = [r for r in reports if _skip_reason(r).startswith(TEMPLATES_SKIP)]
    if not hits:
        return None
    modules = sum(1 for r in hits if isinstance(r, pytest.CollectReport))
    tests = len(hits) - modules
    parts = [f"{tests} test{'s' * (tests != 1)}"]
    if modules:
        parts.append(f"{modules} whole test module{'s' * (modules != 1)}")
    return (f"{len(hits)} real-template tests skipped ({', '.join(parts)}): real chat templates not found in "
            f"{folder}. Fetch them with `python scripts/fetch_templates.py --out DIR` (needs the Hugging Face "
            "Hub) and run with ROWGROVE_TEMPLATES=DIR")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Any:
    """After the short test summary (-r), just before the final counts: the wrapper runs
    outermost and writes once every other summary has been written."""
    result = yield
    reports = terminalreporter.stats.get("skipped", [])
    if any(_skip_reason(r).startswith(TEMPLATES_SKIP) for r in reports):
        _write_templates_line(terminalreporter, reports)
    return result


def _write_templates_line(terminalreporter: Any, reports: list[Any]) -> None:
    line = templates_skip_line(reports, str(templates_dir()))
    if line:
        terminalreporter.write_line(line)
