"""The start-up check on servers without `/tokenize` (older SGLang, a vLLM without the route):
the server's ids for the probe text come from a one-token generation instead, so the same
model folder still passes and another tokenizer is still refused."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from rowgrove.engines import make_engine
from rowgrove.errors import EngineError
from rowgrove.standins.common import StandinState, run_app


@contextmanager
def server_without_tokenize(kind: str, engine):
    if kind == "vllm":
        from rowgrove.standins.vllm import create_app
    else:
        from rowgrove.standins.sglang import create_app
    app = create_app(engine, "tiny", StandinState())
    app.router.routes[:] = [r for r in app.router.routes if "tokenize" not in getattr(r, "path", "")]
    server, thread, url = run_app(app)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def hf_engine():
    return make_engine("hf", "tiny", max_batch=4)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_same_folder_passes_without_tokenize(kind, hf_engine):
    with server_without_tokenize(kind, hf_engine) as url:
        import httpx

        assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}).status_code == 404
        engine = make_engine(kind, "tiny", url=url)  # check() ran and passed
        assert engine.urls == [url]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_another_tokenizer_is_refused_without_tokenize(kind, hf_engine, monkeypatch):
    from rowgrove.engines.remote import RemoteEngine

    with server_without_tokenize(kind, hf_engine) as url:
        # the local folder's tokenizer gives other ids for the probe text than the server's
        real = RemoteEngine.probe_ids
        monkeypatch.setattr(RemoteEngine, "probe_ids", lambda self: [i + 1 for i in real(self)])
        with pytest.raises(EngineError, match="tokenizes the probe text differently"):
            make_engine(kind, "tiny", url=url)
