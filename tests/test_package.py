"""The public surface: names, CLI help, docs that mention every command."""

import subprocess
import sys
from pathlib import Path

import pytest

import rowgrove
from rowgrove.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]


def test_public_names_equal_all():
    import types

    public = {n for n, v in vars(rowgrove).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert public == set(rowgrove.__all__) - {"__version__"}


def test_errors_share_one_root_and_input_errors_are_value_errors():
    from rowgrove import errors

    kinds = [errors.InputError, errors.BadRequest, errors.AuthError, errors.NotFound,
             errors.Conflict, errors.Overloaded, errors.EngineError]
    assert all(issubclass(k, errors.RowgroveError) for k in kinds)
    assert issubclass(errors.BadRequest, ValueError)
    assert errors.name_some(["r7", "r9", "r12"]) == "r7, r9, r12"
    assert errors.name_some([f"r{i}" for i in range(8)], limit=3) == "r0, r1, r2, … (+5 more)"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help_and_is_documented(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip()
    docs = "\n".join(p.read_text() for p in (ROOT / "docs").glob("*.md")) + (ROOT / "README.md").read_text()
    assert f"rowgrove {command}" in docs


def test_top_level_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "rowgrove.cli", "--help"], capture_output=True, text=True, check=True).stdout
    assert all(name in out for name in COMMANDS)


def test_readme_gives_exactly_the_two_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_example_prints_what_it_shows():
    import doctest
    import re

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    test = doctest.DocTestParser().get_doctest(block, {}, "README", "README.md", 0)
    result = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE).run(test)
    assert result.attempted >= 2 and result.failed == 0
