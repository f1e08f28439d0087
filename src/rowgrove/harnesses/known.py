"""How each known CLI harness is pointed at one rollout: its own environment and config home.

`prepare(argv, env, base_url=..., api_key=..., home=..., workdir=...)` returns the (argv, env) to
run; `home` is a fresh folder for the harness's config (so the user's own never applies and nothing
leaks between rollouts). Known by the program's name (argv[0]'s basename): codex, claude, qwen,
opencode, mini. Any other program runs as given (its `{base_url}` / `{api_key}` placeholders are
filled in by the caller).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

MODEL = "policy"   # the model name the harnesses send; the gateway serves one model whatever its name
KEY_VAR = "ROWGROVE_API_KEY"


def _root(base_url: str) -> str:
    """The rollout's base URL without its trailing /v1 (what Anthropic clients want)."""
    return base_url[:-3] if base_url.endswith("/v1") else base_url


def codex(argv: list[str], env: dict[str, str], base_url: str, api_key: str, home: Path,
          workdir: Path) -> tuple[list[str], dict[str, str]]:
    """Codex CLI: CODEX_HOME holding a config.toml whose model provider is the rollout (Responses)."""
    cfg = home / "codex"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "rowgrove"\n\n[model_providers.rowgrove]\nname = "rowgrove"\n'
        f'base_url = "{base_url}"\nenv_key = "{KEY_VAR}"\nwire_api = "responses"\n'
        'request_max_retries = 0\nstream_max_retries = 0\n', encoding="utf-8")
    env.update(CODEX_HOME=str(cfg), **{KEY_VAR: api_key})
    if len(argv) > 1 and argv[1] == "exec" and "--skip-git-repo-check" not in argv:
        argv = [argv[0], "exec", "--skip-git-repo-check", *argv[2:]]
    return argv, env


def claude(argv: list[str], env: dict[str, str], base_url: str, api_key: str, home: Path,
           workdir: Path) -> tuple[list[str], dict[str, str]]:
    """Claude Code: ANTHROPIC_BASE_URL (without /v1), the key, a fresh CLAUDE_CONFIG_DIR, no nonessential traffic."""
    cfg = home / "claude"
    cfg.mkdir(parents=True, exist_ok=True)
    env.update(ANTHROPIC_BASE_URL=_root(base_url), ANTHROPIC_API_KEY=api_key, CLAUDE_CONFIG_DIR=str(cfg),
               CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", ANTHROPIC_MODEL=MODEL,
               ANTHROPIC_SMALL_FAST_MODEL=MODEL, DISABLE_AUTOUPDATER="1")
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    return argv, env


def qwen(argv: list[str], env: dict[str, str], base_url: str, api_key: str, home: Path,
         workdir: Path) -> tuple[list[str], dict[str, str]]:
    """Qwen Code: OPENAI_BASE_URL / OPENAI_API_KEY / OPENAI_MODEL and a fresh HOME (its ~/.qwen settings)."""
    settings = home / ".qwen"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "settings.json").write_text(json.dumps({"security": {"auth": {"selectedType": "openai"}},
                                                        "usageStatisticsEnabled": False}), encoding="utf-8")
    env.update(HOME=str(home), OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key, OPENAI_MODEL=MODEL)
    return argv, env


def opencode(argv: list[str], env: dict[str, str], base_url: str, api_key: str, home: Path,
             workdir: Path) -> tuple[list[str], dict[str, str]]:
    """opencode: a custom OpenAI-compatible provider in a fresh XDG config home, its model the default."""
    cfg = home / "config" / "opencode"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "model": f"rowgrove/{MODEL}", "small_model": f"rowgrove/{MODEL}",
        "autoupdate": False, "share": "disabled",
        "provider": {"rowgrove": {"npm": "@ai-sdk/openai-compatible", "name": "rowgrove",
                                  "options": {"baseURL": base_url, "apiKey": api_key},
                                  "models": {MODEL: {"name": MODEL}}}},
    }), encoding="utf-8")
    env.update(XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               XDG_STATE_HOME=str(home / "state"), XDG_CACHE_HOME=env.get("XDG_CACHE_HOME", str(home / "cache")))
    return argv, env


def mini(argv: list[str], env: dict[str, str], base_url: str, api_key: str, home: Path,
         workdir: Path) -> tuple[list[str], dict[str, str]]:
    """mini-swe-agent: LiteLLM model `openai/<name>` with the rollout as api_base, a fresh config folder."""
    env.update(MSWEA_GLOBAL_CONFIG_DIR=str(home / "mini"), MSWEA_CONFIGURED="true",
               OPENAI_API_BASE=base_url, OPENAI_BASE_URL=base_url, OPENAI_API_KEY=api_key,
               MSWEA_MODEL_NAME=f"openai/{MODEL}", MSWEA_COST_TRACKING="ignore_errors",
               LITELLM_LOCAL_MODEL_COST_MAP="True")  # else LiteLLM fetches its cost map (8 s of retries offline)
    if "-m" not in argv and "--model" not in argv:
        argv = [*argv, "--model", f"openai/{MODEL}"]
    if "-o" not in argv and "--output" not in argv:  # its trajectory, else under ~/.config
        argv = [*argv, "--output", str(home / "mini" / "trajectory.json")]
    # a `pip install --target DIR` copy (scripts/fetch_harnesses.py): its package sits beside bin/
    found = shutil.which(argv[0], path=env.get("PATH"))
    target = Path(found).resolve().parent.parent if found else None
    if target is not None and (target / "minisweagent").is_dir():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), env.get("PYTHONPATH", "")) if p)
    return argv, env


KNOWN: dict[str, Callable[..., tuple[list[str], dict[str, str]]]] = {
    "codex": codex, "claude": claude, "qwen": qwen, "opencode": opencode, "mini": mini,
}


def prepare(argv: list[str], env: dict[str, str], *, base_url: str, api_key: str, home: Path,
            workdir: Path) -> tuple[list[str], dict[str, str]]:
    setup = KNOWN.get(Path(argv[0]).name)
    if setup is None:
        return argv, env
    return setup(list(argv), dict(env), base_url, api_key, home, workdir)
