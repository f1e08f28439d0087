"""Where the coding-agent CLIs installed by scripts/fetch_harnesses.py are, for the harness tests.

`binary(name)` gives the path of `codex`, `claude`, `qwen`, `opencode` or `mini` under the cache
($ROWGROVE_HARNESSES, else $ROWGROVE_CACHE/harnesses, else ~/.cache/rowgrove/harnesses), or skips
the calling test with one line saying how to install it.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest


def root() -> Path:
    env = os.environ.get("ROWGROVE_HARNESSES")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("ROWGROVE_CACHE") or Path.home() / ".cache" / "rowgrove") / "harnesses"


def _arch() -> str:
    return {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower(), "x64")


def paths() -> dict[str, Path]:
    r = root()
    bin_ = r / "npm" / "node_modules" / ".bin"
    return {
        "codex": bin_ / "codex",
        # npm 11 skips Claude Code's postinstall: the native binary sits in its platform package
        "claude": r / "npm" / "node_modules" / "@anthropic-ai" / f"claude-code-linux-{_arch()}" / "claude",
        "qwen": bin_ / "qwen",
        "opencode": bin_ / "opencode",
        "mini": r / "mini" / "bin" / "mini",
    }


def binary(name: str) -> Path:
    path = paths()[name]
    if not path.exists():
        pytest.skip(f"{name} is not installed at {path}: run scripts/fetch_harnesses.py")
    return path
