#!/usr/bin/env python
"""Fetch the real chat templates the test suite names from the Hugging Face Hub into a folder.

The conformance matrix, the parser round trips and the agent-framework tests run on the model
families' real chat templates. Those templates stay under their models' licenses, so they are not
in this repository; the tests read them from `$ROWGROVE_TEMPLATES` and skip without them. On a
machine with internet:

    python scripts/fetch_templates.py --out ~/rowgrove-templates
    ROWGROVE_TEMPLATES=~/rowgrove-templates make test

Each template is taken as the model repository ships it, the way llama.cpp's
`scripts/get_chat_template.py` does: the repository's `chat_template.jinja` when it has one
(the file transformers itself prefers), else the `chat_template` field of its
`tokenizer_config.json` (a string, or a list of named variants of which "default" is taken). It
is written unchanged, as `<file>.jinja` under the name the tests look for (`TEMPLATES` below).

Two repositories are gated (meta-llama/Llama-3.1-8B-Instruct,
mistralai/Mistral-Nemo-Instruct-2407): accept their license on the Hub page, then log in with
`hf auth login` or pass a token (`--token`, or `HF_TOKEN`). The script fetches every template it
can, names each one it could not and why, and exits 1 if any is missing.

With `huggingface_hub` installed (it comes with transformers) the files go through it: its cache
and the login token. Without it, or with `--via http`, they are read over plain HTTPS from
`{endpoint}/{repo}/resolve/{revision}/{file}`. `--endpoint` (default `$HF_ENDPOINT`, else
https://huggingface.co) points at a mirror. `--revision` pins a commit, tag or branch for every
repository. A template fetched later than the suite's own may differ from it, since model
repositories do update their templates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

# The file name each test looks for (tests/families.py `template_file`, tests/parsers) and the
# Hub repository whose template it is. The names follow llama.cpp's models/templates/ folder.
TEMPLATES: dict[str, str] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "Qwen/Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B.jinja": "Qwen/Qwen3-0.6B",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "meta-llama/Llama-3.1-8B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistralai/Mistral-Nemo-Instruct-2407",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-ai/DeepSeek-V3.1",
    "openai-gpt-oss-120b.jinja": "openai/gpt-oss-120b",
    "GLM-4.6.jinja": "zai-org/GLM-4.6",
}

DEFAULT_ENDPOINT = "https://huggingface.co"

# fetch(repo_id, filename) -> the file's bytes, or None when the repository has no such file.
# Any other failure raises FetchError naming the cause.
Fetch = Callable[[str, str], "bytes | None"]


class FetchError(Exception):
    """A template could not be had; the message names the repository, the cause and the fix."""


def template_from_repo(repo_id: str, fetch: Fetch) -> tuple[str, str]:
    """(template text, where it came from) for one repository, as the repository ships it:
    `chat_template.jinja` if present, else `tokenizer_config.json`'s `chat_template` (a string, or
    the "default" entry of a list of `{"name", "template"}` variants). FetchError otherwise."""
    raw = fetch(repo_id, "chat_template.jinja")
    if raw is not None:
        return _text(raw, repo_id, "chat_template.jinja"), "chat_template.jinja"
    raw = fetch(repo_id, "tokenizer_config.json")
    if raw is None:
        raise FetchError(f"{repo_id} has neither chat_template.jinja nor tokenizer_config.json: check the "
                         "repository id and --revision")
    try:
        config = json.loads(_text(raw, repo_id, "tokenizer_config.json"))
    except json.JSONDecodeError as e:
        raise FetchError(f"{repo_id}: tokenizer_config.json is not valid JSON ({e})") from None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, str) and template:
        return template, "tokenizer_config.json"
    if isinstance(template, list):
        variants = {v.get("name"): v.get("template") for v in template if isinstance(v, dict)}
        if isinstance(variants.get("default"), str):
            return variants["default"], 'tokenizer_config.json (variant "default")'
        raise FetchError(f"{repo_id}: tokenizer_config.json has chat template variants "
                         f"{', '.join(map(str, variants))} but no \"default\"")
    raise FetchError(f"{repo_id} ships no chat template (no chat_template.jinja, no chat_template in "
                     "tokenizer_config.json)")


def _text(raw: bytes, repo_id: str, filename: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FetchError(f"{repo_id}: {filename} is not UTF-8 ({e})") from None


def http_fetch(endpoint: str = DEFAULT_ENDPOINT, revision: str = "main", token: str | None = None,
               timeout: float = 60.0) -> Fetch:
    """A fetch over plain HTTP(S): GET {endpoint}/{repo}/resolve/{revision}/{file} (the Hub's
    download URL), following redirects; 404 is a missing file (None)."""
    base = endpoint.rstrip("/")

    def fetch(repo_id: str, filename: str) -> bytes | None:
        url = f"{base}/{repo_id}/resolve/{revision}/{filename}"
        req = urllib.request.Request(url, headers={"user-agent": "rowgrove-fetch-templates"})
        if token:
            req.add_header("authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            if e.code in (401, 403):
                raise FetchError(_gated(repo_id, e.code)) from None
            raise FetchError(f"{repo_id}: {url} answered HTTP {e.code}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FetchError(f"{repo_id}: cannot reach {base} ({reason}): this needs internet access "
                             "(or --endpoint to a mirror)") from None

    return fetch


def hub_fetch(endpoint: str | None = None, revision: str = "main", token: str | None = None,
              cache_dir: str | None = None) -> Fetch:
    """A fetch through huggingface_hub's `hf_hub_download` (its cache, and the token of
    `hf auth login` when `token` is None)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:  # huggingface_hub >= 1.0: a file the repository lacks (not a file missing from an offline cache)
        from huggingface_hub.errors import RemoteEntryNotFoundError as Missing
    except ImportError:
        from huggingface_hub.errors import EntryNotFoundError as Missing

    def fetch(repo_id: str, filename: str) -> bytes | None:
        try:
            path = hf_hub_download(repo_id, filename, revision=revision, token=token, endpoint=endpoint,
                                   cache_dir=cache_dir)
        except Missing:
            return None
        except GatedRepoError:
            raise FetchError(_gated(repo_id, 403)) from None
        except RevisionNotFoundError:
            raise FetchError(f"{repo_id} has no revision {revision!r}: check --revision") from None
        except RepositoryNotFoundError:
            raise FetchError(f"{repo_id} was not found on the Hub (or it is private and no token was "
                             "given): check the id, or log in with `hf auth login`") from None
        except Exception as e:  # noqa: BLE001 - network and server errors: name them, go on with the rest
            offline = (" HF_HUB_OFFLINE is set in this environment: unset it, or use --via http."
                       if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on") else "")
            raise FetchError(f"{repo_id}: {filename} could not be downloaded ({type(e).__name__}: "
                             f"{str(e)[:200]}): this needs internet access (or --endpoint to a mirror).{offline}") from None
        return Path(path).read_bytes()

    return fetch


def _gated(repo_id: str, code: int) -> str:
    return (f"{repo_id} refused access (HTTP {code}): it is gated. Accept its license on "
            f"https://huggingface.co/{repo_id}, then log in with `hf auth login` or pass --token "
            "(or set HF_TOKEN)")


def write_template(out: Path, name: str, text: str) -> Path:
    """Write `text` to out/name unchanged (UTF-8, no newline added), atomically: a reader never
    sees half a template."""
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.replace(tmp, out / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out / name


def fetch_all(out: Path, fetch: Fetch, names: Sequence[str] | None = None,
              log: Callable[[str], None] = print) -> dict[str, str]:
    """Fetch the named templates (default: all of TEMPLATES) into `out`. Returns {name: why} for
    each one that could not be had; the others are written, one line logged per template."""
    wanted = list(names) if names else list(TEMPLATES)
    unknown = [n for n in wanted if n not in TEMPLATES]
    if unknown:
        raise FetchError(f"unknown template {unknown[0]!r}: one of {', '.join(TEMPLATES)}")
    failed: dict[str, str] = {}
    for name in wanted:
        repo = TEMPLATES[name]
        try:
            text, source = template_from_repo(repo, fetch)
        except FetchError as e:
            failed[name] = str(e)
            log(f"MISSING {name}: {e}")
            continue
        path = write_template(out, name, text)
        log(f"ok      {name} <- {repo} {source} ({len(text)} chars) -> {path}")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Then: ROWGROVE_TEMPLATES=OUT make test (or pytest).")
    p.add_argument("--out", type=Path, help="folder to write the .jinja files into (required unless --list)")
    p.add_argument("--revision", default="main", help="commit, tag or branch of every repository (default main)")
    p.add_argument("--endpoint", default=os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT,
                   help="the Hub's address (default $HF_ENDPOINT, else https://huggingface.co)")
    p.add_argument("--token", default=os.environ.get("HF_TOKEN"),
                   help="a Hugging Face token for the gated repositories (default $HF_TOKEN, else your login)")
    p.add_argument("--via", choices=("auto", "hub", "http"), default="auto",
                   help="hub: huggingface_hub; http: plain HTTPS; auto: hub when installed (default)")
    p.add_argument("--only", action="append", metavar="NAME", help="fetch only this file (repeatable)")
    p.add_argument("--list", action="store_true", help="print the templates and their repositories, fetch nothing")
    args = p.parse_args(argv)
    if args.list:
        for name, repo in TEMPLATES.items():
            print(f"{name}\t{repo}")
        return 0
    if args.out is None:
        p.error("--out FOLDER is required: where the .jinja files go (then set ROWGROVE_TEMPLATES to it)")
    via = args.via
    if via == "auto":
        try:
            import huggingface_hub  # noqa: F401
            via = "hub"
        except ImportError:
            via = "http"
    if via == "hub":
        fetch = hub_fetch(endpoint=args.endpoint, revision=args.revision, token=args.token)
    else:
        fetch = http_fetch(args.endpoint, args.revision, args.token)
    try:
        failed = fetch_all(args.out, fetch, args.only)
    except FetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = len(args.only or TEMPLATES)
    if failed:
        print(f"{total - len(failed)} of {total} templates fetched into {args.out}; missing: "
              f"{', '.join(failed)} (the tests that need them skip)", file=sys.stderr)
        return 1
    print(f"{total} templates in {args.out}: run the tests with ROWGROVE_TEMPLATES={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
