#!/usr/bin/env python
"""Install the coding-agent CLIs the harness tests drive, at pinned versions, into a cache folder.

npm: `@openai/codex`, `@anthropic-ai/claude-code`, `@qwen-code/qwen-code`, `opencode-ai`, into
`<out>/npm` (one `npm install --prefix`); PyPI: `mini-swe-agent` with `--no-deps` into
`<out>/mini` (a `pip install --target` folder used beside an environment that already has litellm;
its few small dependencies the main environment may lack are listed in MINI_DEPS).

`<out>` is `--out`, else $ROWGROVE_HARNESSES, else `$ROWGROVE_CACHE/harnesses` (default
`~/.cache/rowgrove/harnesses`): where tests/harnesses.py looks. A part already installed at its
pinned version is not installed again.

Exit status: 0 when every harness is installed; 1 when one could not be had. `--if-possible` (what
`make test` runs) turns "could not be had" (no npm, no network) into one line and exit 0: the tests
that need a missing harness skip and say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

NPM: dict[str, str] = {
    "@openai/codex": "0.171.0",
    "@anthropic-ai/claude-code": "2.1.197",
    "@qwen-code/qwen-code": "0.15.10",
    "opencode-ai": "1.18.33",
}
MINI = ("mini-swe-agent", "2.4.6")
# beside litellm, jinja2, pydantic, rich, typer, tenacity (the `mini` CLI imports prompt_toolkit)
MINI_DEPS = ("platformdirs", "python-dotenv", "prompt_toolkit", "wcwidth")
TIMEOUT_S = 600.0


def default_out() -> Path:
    env = os.environ.get("ROWGROVE_HARNESSES")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("ROWGROVE_CACHE") or Path.home() / ".cache" / "rowgrove") / "harnesses"


def npm_installed(out: Path) -> list[str]:
    """The pinned npm packages not yet installed under <out>/npm at their version."""
    missing = []
    for name, version in NPM.items():
        meta = out / "npm" / "node_modules" / name / "package.json"
        try:
            ok = json.loads(meta.read_text(encoding="utf-8")).get("version") == version
        except (OSError, ValueError):
            ok = False
        if not ok:
            missing.append(name)
    return missing


def mini_installed(out: Path) -> bool:
    mini = out / "mini"
    return any(mini.glob(f"mini_swe_agent-{MINI[1]}.dist-info")) and (mini / "prompt_toolkit").is_dir()


def install_npm(out: Path, names: list[str]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    (out / "npm").mkdir(parents=True, exist_ok=True)
    specs = [f"{n}@{NPM[n]}" for n in names]
    r = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(out / "npm"), *specs],
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"npm install failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")


def install_mini(out: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(out / "mini"),
                        f"{MINI[0]}=={MINI[1]}", *MINI_DEPS], capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        raise RuntimeError(f"pip install failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="the cache folder (default $ROWGROVE_CACHE/harnesses)")
    p.add_argument("--if-possible", action="store_true", help="without npm or network: one line, exit 0")
    args = p.parse_args(argv)
    out = args.out or default_out()
    errors = []
    missing = npm_installed(out)
    if missing:
        try:
            install_npm(out, missing)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"{', '.join(missing)}: {e}")
    if not mini_installed(out):
        try:
            install_mini(out)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            errors.append(f"{MINI[0]}: {e}")
    if errors:
        line = f"fetch_harnesses: could not install {'; '.join(errors)} (the harness tests that need them skip)"
        print(line, file=sys.stderr)
        return 0 if args.if_possible else 1
    print(f"fetch_harnesses: codex, claude, qwen, opencode and mini-swe-agent are in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
