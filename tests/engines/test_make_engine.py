"""make_engine builds both engines behind the Engine protocol and refuses what it cannot build."""

from __future__ import annotations

import asyncio

import pytest

from rowgrove.engines import Engine, make_engine
from rowgrove.errors import InputError


@pytest.mark.parametrize("kind", ["hf", "scripted"])
def test_both_kinds_satisfy_the_protocol(kind):
    eng = make_engine(kind, "tiny-llama3", threads=1)
    try:
        assert isinstance(eng, Engine)
        assert eng.tokenizer.eos_token == "<|eot_id|>"
    finally:
        asyncio.run(eng.aclose())


def test_refusals_name_the_problem():
    with pytest.raises(InputError, match="unknown engine 'trt'"):
        make_engine("trt", "tiny")
    with pytest.raises(InputError, match="vllm engine needs url="):
        make_engine("vllm", "tiny")
    with pytest.raises(InputError, match="sglang engine does not take max_batch"):
        make_engine("sglang", "tiny", url="http://127.0.0.1:1", max_batch=4)
    with pytest.raises(InputError, match="does not take max_batch"):
        make_engine("scripted", "tiny", max_batch=4)
