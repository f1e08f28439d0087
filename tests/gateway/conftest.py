"""Shared fixtures for gateway tests: the tiny model's tokenizers for the three shipped chat
templates (ChatML, Qwen3-style, Llama-3-style) and a Renderer for each. Built once per session
(offline, cached on disk by `rowgrove.model.tiny`). HTTP fixtures live in fixtures_http.py."""

from __future__ import annotations

import pytest

SPECS = {"chatml": "tiny", "qwen3": "tiny-qwen3", "llama3": "tiny-llama3"}


@pytest.fixture(scope="session")
def tokenizers():
    """{"chatml" | "qwen3" | "llama3": tokenizer} of the tiny model."""
    from rowgrove.model.load import load_tokenizer

    return {name: load_tokenizer(spec) for name, spec in SPECS.items()}


@pytest.fixture(scope="session")
def renderers(tokenizers):
    """{"chatml" | "qwen3" | "llama3": Renderer}."""
    from rowgrove.gateway.core.render import Renderer

    return {name: Renderer(tok) for name, tok in tokenizers.items()}


@pytest.fixture(params=list(SPECS))
def renderer(request, renderers):
    """A Renderer for each template variant in turn."""
    return renderers[request.param]
