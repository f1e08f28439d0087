"""The hardening flags of `rowgrove serve` reach the gateway's settings and the ledger, and the
ledger's durability option sets SQLite's `synchronous`."""

from __future__ import annotations

import argparse

import pytest

from fixtures_http import TestEngine, scripted_engine
from rowgrove.errors import InputError
from rowgrove.ledger import Ledger


def _parse(*argv: str) -> argparse.Namespace:
    from rowgrove.commands import serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p.parse_args(list(argv))


def test_flag_defaults_match_the_settings_defaults(tmp_path):
    from rowgrove.gateway.sessions import GatewaySettings

    args = _parse("--ledger", str(tmp_path / "l.db"))
    d = GatewaySettings()
    assert args.max_json_depth == d.max_json_depth == 64
    assert args.body_timeout == d.body_timeout == 30.0
    assert args.max_open_uploads == d.max_open_uploads == 256
    assert args.public_url is None and d.public_url is None
    assert args.trusted_proxy == [] and d.trusted_proxies == ()
    assert args.durability == "normal"


def test_run_passes_the_flags_on(tmp_path, monkeypatch):
    import rowgrove.engines
    import rowgrove.gateway.server
    from rowgrove.commands import serve

    seen: dict = {}

    def fake_serve(engine, ledger, *, host, port, settings, log_level):
        seen["settings"] = settings
        seen["synchronous"] = ledger._db.execute("PRAGMA synchronous").fetchone()[0]

    monkeypatch.setattr(rowgrove.gateway.server, "serve", fake_serve)
    monkeypatch.setattr(rowgrove.engines, "make_engine", lambda *a, **kw: TestEngine(scripted_engine("tiny")))
    args = _parse("--ledger", str(tmp_path / "l.db"), "--port", "0", "--max-json-depth", "32",
                  "--body-timeout", "5", "--max-open-uploads", "9", "--public-url", "https://gw.example",
                  "--trusted-proxy", "10.0.0.1", "--trusted-proxy", "10.1.0.0/16", "--durability", "full",
                  "--log-level", "warning")
    assert serve.run(args) == 0
    s = seen["settings"]
    assert (s.max_json_depth, s.body_timeout, s.max_open_uploads) == (32, 5.0, 9)
    assert s.public_url == "https://gw.example" and s.trusted_proxies == ("10.0.0.1", "10.1.0.0/16")
    assert s.model_name == "tiny"
    assert seen["synchronous"] == 2  # FULL


def test_bad_hardening_flags_are_refused_naming_the_flag(tmp_path, monkeypatch):
    from rowgrove.commands import serve

    for flags, words in ((["--max-json-depth", "0"], "--max-json-depth"), (["--max-json-depth", "999"], "--max-json-depth"),
                         (["--body-timeout", "0"], "--body-timeout"), (["--max-open-uploads", "0"], "--max-open-uploads"),
                         (["--public-url", "gw.example"], "--public-url"), (["--trusted-proxy", "x"], "--trusted-proxy")):
        args = _parse("--ledger", str(tmp_path / "l.db"), *flags)
        with pytest.raises(InputError, match=words):
            serve.run(args)
        assert not (tmp_path / "l.db").exists()  # refused before anything is created


def test_durability_sets_sqlite_synchronous(tmp_path):
    with Ledger(tmp_path / "a.db") as led:
        assert led._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with Ledger(tmp_path / "b.db", durability="full") as led:
        assert led._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert led._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(InputError, match="durability"):
        Ledger(tmp_path / "c.db", durability="paranoid")
    assert not (tmp_path / "c.db").exists()


def test_the_server_process_keeps_freed_large_blocks_on_glibc():
    """`hold_freed_memory` (what `serve` calls with the default settings) takes on glibc, in a
    process of its own: a 1 MB block freed and asked for again comes from the heap, not fresh
    pages (the minor faults of the second allocation stay near zero)."""
    import platform
    import subprocess
    import sys

    code = (
        "import ctypes, resource\n"
        "from rowgrove.gateway.server import hold_freed_memory\n"
        "ok = hold_freed_memory()\n"
        "libc = ctypes.CDLL(None)\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "def touch():\n"
        "    p = libc.malloc(1 << 20); ctypes.memset(p, 1, 1 << 20); return p\n"
        "libc.free(touch())\n"
        "f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "libc.free(touch())\n"
        "print(ok, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if platform.libc_ver()[0] != "glibc":
        assert out[0] == "False"
        return
    assert out[0] == "True"
    assert int(out[1]) < 32  # a fresh 1 MB block would fault its 256 pages in
