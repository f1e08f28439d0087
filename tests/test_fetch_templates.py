"""scripts/fetch_templates.py, offline: every family the suite names has a Hub repository in the
script; templates are taken as the repository ships them (chat_template.jinja first, else
tokenizer_config.json's chat_template, a string or the "default" variant) and written unchanged
under the names the tests read. The Hub is a fake on loopback serving its download URLs
(`/{repo}/resolve/{revision}/{file}`); nothing here contacts the real Hub."""

from __future__ import annotations

import http.server
import importlib.util
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fetch_templates.py"

spec = importlib.util.spec_from_file_location("fetch_templates", SCRIPT)
ft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ft)

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "parsers"))
from families import FAMILIES  # noqa: E402
from parser_templates import SPECIALS  # noqa: E402

TOKEN = "hf_test_token"
GATED = "meta-llama/Llama-3.1-8B-Instruct"


def _hub_files() -> dict[tuple[str, str], bytes]:
    """A fake Hub: each of the script's repositories ships its template in one of the real shapes."""
    files: dict[tuple[str, str], bytes] = {}
    shapes = ["jinja", "config", "variants", "both", "jinja", "config", "jinja"]
    for (name, repo), shape in zip(ft.TEMPLATES.items(), shapes, strict=True):
        text = f"{{# {name} #}}{{{{ bos_token }}}}{{% for m in messages %}}<｜{{{{ m.role }}}}｜>\r\n{{% endfor %}}"
        if shape in ("jinja", "both"):
            files[(repo, "chat_template.jinja")] = text.encode()
        if shape == "config":
            files[(repo, "tokenizer_config.json")] = json.dumps({"chat_template": text, "eos_token": "x"}).encode()
        if shape == "variants":
            files[(repo, "tokenizer_config.json")] = json.dumps({"chat_template": [
                {"name": "tool_use", "template": "not this one"}, {"name": "default", "template": text}]}).encode()
        if shape == "both":  # transformers prefers chat_template.jinja over the config's field
            files[(repo, "tokenizer_config.json")] = json.dumps({"chat_template": "stale"}).encode()
    return files


def _expected(name: str) -> str:
    return f"{{# {name} #}}{{{{ bos_token }}}}{{% for m in messages %}}<｜{{{{ m.role }}}}｜>\r\n{{% endfor %}}"


class FakeHub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, files: dict[tuple[str, str], bytes]):
        self.files = files
        self.requests: list[tuple[str, str, str | None]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeHub

    def log_message(self, *args) -> None:
        pass

    def _answer(self, body: bool) -> None:
        parts = self.path.split("?")[0].strip("/").split("/")
        auth = self.headers.get("authorization")
        self.server.requests.append((self.command, self.path, auth))
        if len(parts) != 5 or parts[2] != "resolve":
            return self._error(404, "RepoNotFound")
        repo, revision, filename = f"{parts[0]}/{parts[1]}", parts[3], parts[4]
        if repo == GATED and auth != f"Bearer {TOKEN}":
            return self._error(401 if auth is None else 403, "GatedRepo")
        data = self.server.files.get((repo, filename))
        if data is None or revision != "main":
            return self._error(404, "EntryNotFound" if revision == "main" else "RevisionNotFound")
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.send_header("etag", f'"{abs(hash(data)):x}"')
        self.send_header("x-repo-commit", "0" * 40)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, code: int, kind: str) -> None:
        body = json.dumps({"error": kind}).encode()
        self.send_response(code)
        self.send_header("x-error-code", kind)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    server = FakeHub(_hub_files())
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server
    server.shutdown()
    server.server_close()


def test_the_script_names_every_template_the_suite_reads():
    names = set(ft.TEMPLATES)
    assert {f.template_file for f in FAMILIES.values()} <= names
    assert set(SPECIALS) <= names
    assert all(repo.count("/") == 1 for repo in ft.TEMPLATES.values())


def _dict_fetch(files):
    def fetch(repo_id: str, filename: str) -> bytes | None:
        return files.get((repo_id, filename))
    return fetch


def test_template_from_repo_takes_what_the_repository_ships():
    files = _hub_files()
    for name, repo in ft.TEMPLATES.items():
        text, source = ft.template_from_repo(repo, _dict_fetch(files))
        assert text == _expected(name)
    sources = {repo: ft.template_from_repo(repo, _dict_fetch(files))[1] for repo in ft.TEMPLATES.values()}
    assert sources["Qwen/Qwen2.5-7B-Instruct"] == "chat_template.jinja"
    assert sources["Qwen/Qwen3-0.6B"] == "tokenizer_config.json"
    assert sources["meta-llama/Llama-3.1-8B-Instruct"] == 'tokenizer_config.json (variant "default")'
    assert sources["mistralai/Mistral-Nemo-Instruct-2407"] == "chat_template.jinja"  # not the config's "stale"


@pytest.mark.parametrize(("files", "match"), [
    ({}, "neither chat_template.jinja nor tokenizer_config.json"),
    ({("o/r", "tokenizer_config.json"): b"{}"}, "ships no chat template"),
    ({("o/r", "tokenizer_config.json"): b"{not json"}, "not valid JSON"),
    ({("o/r", "tokenizer_config.json"): json.dumps({"chat_template": [{"name": "tool_use", "template": "t"}]}).encode()},
     'no "default"'),
    ({("o/r", "chat_template.jinja"): b"\xff\xfe"}, "not UTF-8"),
])
def test_template_from_repo_names_what_is_wrong(files, match):
    with pytest.raises(ft.FetchError, match=match):
        ft.template_from_repo("o/r", _dict_fetch(files))


def test_fetch_all_writes_each_file_unchanged_and_reports_the_rest(tmp_path):
    files = _hub_files()
    del files[("zai-org/GLM-4.6", "chat_template.jinja")]
    lines: list[str] = []
    failed = ft.fetch_all(tmp_path / "t", _dict_fetch(files), log=lines.append)
    assert list(failed) == ["GLM-4.6.jinja"] and "zai-org/GLM-4.6" in failed["GLM-4.6.jinja"]
    for name in ft.TEMPLATES:
        path = tmp_path / "t" / name
        if name == "GLM-4.6.jinja":
            assert not path.exists()
        else:
            assert path.read_bytes() == _expected(name).encode()  # \r\n kept, no newline added
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(set(ft.TEMPLATES) - {"GLM-4.6.jinja"})
    assert len(lines) == len(ft.TEMPLATES)
    with pytest.raises(ft.FetchError, match="unknown template 'nope.jinja'"):
        ft.fetch_all(tmp_path / "t", _dict_fetch(files), ["nope.jinja"])


def test_http_fetch_against_the_hubs_download_urls(hub, tmp_path):
    fetch = ft.http_fetch(hub.url, token=TOKEN)
    assert fetch("Qwen/Qwen2.5-7B-Instruct", "chat_template.jinja") == _expected("Qwen-Qwen2.5-7B-Instruct.jinja").encode()
    assert fetch("Qwen/Qwen2.5-7B-Instruct", "absent.json") is None
    assert ("GET", "/Qwen/Qwen2.5-7B-Instruct/resolve/main/chat_template.jinja", f"Bearer {TOKEN}") in hub.requests
    with pytest.raises(ft.FetchError, match=r"gated\. Accept its license"):
        ft.http_fetch(hub.url)(GATED, "tokenizer_config.json")
    with pytest.raises(ft.FetchError, match="cannot reach"):
        ft.http_fetch("http://127.0.0.1:9", timeout=5)("o/r", "chat_template.jinja")


def _run(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    # other test modules set HF_HUB_OFFLINE=1 for the whole session (nothing here may download);
    # the script must be free to reach the fake Hub on loopback
    drop = ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", **(env_extra or {}))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("via", ["http", "hub"])
def test_the_script_end_to_end(hub, tmp_path, via):
    out = tmp_path / "templates"
    extra = {"HF_HOME": str(tmp_path / "hf")}
    # without a token the gated repository is named, the rest are written, exit 1
    r = _run("--out", str(out), "--via", via, "--endpoint", hub.url, env_extra=extra)
    assert r.returncode == 1, r.stderr
    assert "MISSING meta-llama-Llama-3.1-8B-Instruct.jinja" in r.stdout and "gated" in r.stdout
    assert "6 of 7 templates fetched" in r.stderr
    # with the token (HF_TOKEN) every template the suite names is there, byte for byte
    r = _run("--out", str(out), "--via", via, "--endpoint", hub.url, env_extra={**extra, "HF_TOKEN": TOKEN})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ROWGROVE_TEMPLATES={out}" in r.stdout
    for f in FAMILIES.values():
        assert (out / f.template_file).read_bytes() == _expected(f.template_file).encode()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    methods = {m for m, _, _ in hub.requests}
    assert methods == ({"GET"} if via == "http" else {"GET", "HEAD"})  # huggingface_hub asks HEAD first


def test_the_script_refuses_a_revision_it_cannot_find(hub, tmp_path):
    r = _run("--out", str(tmp_path / "t"), "--via", "http", "--endpoint", hub.url, "--revision", "v9",
             "--only", "GLM-4.6.jinja")
    assert r.returncode == 1 and "check the repository id and --revision" in r.stdout


def test_an_offline_hub_client_is_named_as_the_reason(hub, tmp_path):
    # huggingface_hub refuses every download under HF_HUB_OFFLINE=1; the script says so
    r = _run("--out", str(tmp_path / "t"), "--via", "hub", "--endpoint", hub.url, "--only", "Qwen-Qwen3-0.6B.jinja",
             env_extra={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1
    assert "HF_HUB_OFFLINE is set" in r.stdout + r.stderr
