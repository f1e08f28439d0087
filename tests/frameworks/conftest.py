"""Fixtures for the agent-framework tests (helpers live in frameworks_support.py).

Every test here is marked `frameworks` and needs the `frameworks` extra
(`pip install -e '.[dev,frameworks]'`, which `make test` does); a missing framework skips its
test. The frameworks are kept off the network: no tracing exporters, no telemetry, LiteLLM's
bundled model-cost map.
"""

from __future__ import annotations

import os

import pytest

for _k, _v in {
    "OPENAI_API_KEY": "sk-unused",               # clients built without a key still construct
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "HF_HUB_OFFLINE": "1",
    "SMOLAGENTS_TELEMETRY": "false",
}.items():
    os.environ.setdefault(_k, _v)

from frameworks_support import PolicyEngine, model_case, scripted_engine  # noqa: E402

# "tiny": ChatML with hermes tool calls. "qwen3" / "llama3.1": tiny models with the real chat
# templates on their real vocabularies (tests/families.py suite_model_dir; the tiny vocabulary
# while the real tokenizers are missing); they skip, saying why, while the templates are missing.
# Another family is one more name here.
MODEL_CASES = ["tiny", "qwen3", "llama3.1"]



@pytest.fixture(params=MODEL_CASES)
def case(request):
    """The model a framework test runs on (one test per case)."""
    return model_case(request.param)


@pytest.fixture
def gateway(case):
    """`make(policy)` → a running gateway over a PolicyEngine on `case`'s model; closed after the
    test. The handle's `.engine` is the PolicyEngine (prompts and replies it saw)."""
    from rowgrove.gateway.testing import launch_gateway

    handles = []

    def make(policy):
        engine = PolicyEngine(scripted_engine(case.spec), policy)
        gw = launch_gateway(case.spec, engine)
        handles.append(gw)
        return gw

    yield make
    for gw in handles:
        gw.close()
