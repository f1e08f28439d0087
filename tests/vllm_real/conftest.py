"""Fixtures of the real-vLLM suite: vLLM's CPU build (`scripts/install_vllm_env.sh`, environment
`.venv-stack-vllm`, or the python named by $ROWGROVE_VLLM_PYTHON) serving tiny models rowgrove builds
offline, started by `rowgrove.engines.launch.start_vllm` (the command line docs/engines.md
gives and scripts/gpu_check.sh uses).

Two servers for the whole session, started side by side (each takes ~20-30 s here):

    untied   hidden 64, 2 heads (head_dim 32), separate lm_head, its end-of-turn made likely
             (`ending_model`) so that turns end with the stop token: calls, rows, abort, syncs
    tied     the same with tied embeddings, its stop ids made unlikely (`ending_model(p_end=0)`):
             the stale-output-layer case of weight sync, and requests long enough to abort

Without the environment every test here is skipped with the reason; with
ROWGROVE_REQUIRE_VLLM=1 (make test sets it) a missing environment is a failure instead.
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from real_vllm import ending_model, vllm_python  # noqa: E402

from rowgrove.engines.launch import VLLMServer, start_vllm  # noqa: E402
from rowgrove.model.tiny import servable_kwargs, tiny_model_dir  # noqa: E402


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    missing = vllm_python() is None
    for item in items:
        if Path(str(item.fspath)).parent != here:
            continue
        item.add_marker(pytest.mark.vllm)
        if missing and os.environ.get("ROWGROVE_REQUIRE_VLLM") != "1":
            item.add_marker(pytest.mark.skip(reason="no vLLM environment: run scripts/install_vllm_env.sh "
                                                    "(make test does) or set ROWGROVE_VLLM_PYTHON"))


@pytest.fixture(scope="session")
def vllm_py() -> Path:
    py = vllm_python()
    if py is None:
        pytest.fail("ROWGROVE_REQUIRE_VLLM=1 but no vLLM environment: run scripts/install_vllm_env.sh")
    return py


@pytest.fixture(scope="session")
def models() -> dict[str, Path]:
    """The two servable tiny models (chatml template), built offline once."""
    return {"untied": ending_model(tiny_model_dir(**servable_kwargs(), tie_embeddings=False)),
            "tied": ending_model(tiny_model_dir(**servable_kwargs(), tie_embeddings=True), p_end=0.0)}


@pytest.fixture(scope="session")
def servers(vllm_py, models, tmp_path_factory) -> dict[str, VLLMServer]:
    """`vllm serve` of each model on loopback, started in parallel, stopped (whole process
    groups) at the end of the session."""
    logs = tmp_path_factory.mktemp("vllm-logs")
    started: dict[str, VLLMServer] = {}

    def start(name: str) -> tuple[str, VLLMServer]:
        # the tied server logs requests: its log shows the abort of a request by id
        extra = ["--enable-log-requests"] if name == "tied" else []
        return name, start_vllm(models[name], python=vllm_py, log_path=logs / f"{name}.log", omp_threads=1,
                                extra_args=extra)

    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(start, n) for n in models]
            for f in futures:
                name, server = f.result()
                started[name] = server
        yield started
    finally:
        for s in started.values():
            s.stop()
