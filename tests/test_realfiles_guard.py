"""No test finds or opens a real template or a real tokenizer by itself: only tests/realfiles.py
does, so a missing
folder skips with the suite's reason instead of erroring on a fresh clone (the failure a direct
read caused in the real-vLLM rendering tests). A cheap static check; `.ci/run` also runs the
modules that use these files with none present (scripts/check_fresh_clone.sh)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# what reading the folder without the helper looks like
FORBIDDEN = {
    "the templates folder's location": re.compile(r"""["']shared["']|\.\./shared|shared/templates"""),
    "the $ROWGROVE_TEMPLATES variable, read": re.compile(
        r"""(environ\.get\(|environ\[|getenv\()\s*["']ROWGROVE_TEMPLATES"""),
    "templates_dir() outside the helper": re.compile(r"\btemplates_dir\s*\("),
    "the real tokenizers' cache folder": re.compile(r"""["']tokenizers["']|rowgrove/tokenizers"""),
    "the $ROWGROVE_TOKENIZERS variable, read": re.compile(
        r"""(environ\.get\(|environ\[|getenv\()\s*["']ROWGROVE_TOKENIZERS"""),
    "tokenizers_dir() outside the helper": re.compile(r"\btokenizers_dir\s*\("),
}
# the helper itself, the closing line that names the folder, and this file
ALLOWED = {TESTS / "realfiles.py", TESTS / "conftest.py", Path(__file__).resolve()}


def offences(text: str) -> list[str]:
    """(what, line) for each line of `text` that reaches the templates folder directly."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for what, pattern in FORBIDDEN.items():
            if pattern.search(code):
                found.append(f"line {n}: {what}: {line.strip()}")
    return found


@pytest.mark.parametrize("path", sorted(p for p in TESTS.rglob("*.py") if p.resolve() not in ALLOWED),
                         ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_reads_a_real_template_outside_the_helper(path):
    found = offences(path.read_text(encoding="utf-8"))
    assert not found, (f"{path.relative_to(TESTS)} reaches the real templates or tokenizers directly; read them "
                       "through tests/realfiles.py (template_text, require_templates, tokenizer_folder, "
                       "require_tokenizers) so a fresh clone skips:\n"
                       + "\n".join(found))


@pytest.mark.parametrize("line", [
    'Path(__file__).parents[2] / "shared" / "templates" / "GLM-4.6.jinja"',
    'open("../shared/templates/x.jinja").read()',
    'folder = Path(os.environ.get("ROWGROVE_TEMPLATES", "."))',
    'folder = os.environ["ROWGROVE_TEMPLATES"]',
    '(templates_dir() / fam.template_file).read_text()',
    'folder = Path.home() / ".cache" / "rowgrove" / "tokenizers" / "qwen3"',
    'AutoTokenizer.from_pretrained("~/.cache/rowgrove/tokenizers/qwen3")',
    'folder = os.environ.get("ROWGROVE_TOKENIZERS")',
    'tokenizers_dir() / "gpt-oss" / "tokenizer.json"',
])
def test_the_guard_sees_a_direct_read(line):
    assert offences(line)


def test_the_guard_lets_the_helper_and_env_settings_through():
    assert not offences('text = template_text("GLM-4.6.jinja")')
    assert not offences('env = dict(os.environ, ROWGROVE_TEMPLATES=str(empty))')
    assert not offences('# reads ../shared/templates through realfiles')
    assert not offences('folder = tokenizer_folder("qwen3")')
    assert not offences('env = dict(os.environ, ROWGROVE_TOKENIZERS=str(empty))')
    assert not offences('from tokenizers import Tokenizer')
