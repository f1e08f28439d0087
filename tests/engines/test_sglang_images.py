"""A vision request through the real gateway to the SGLang stand-in (over loopback HTTP, official
openai SDK): `/generate` gets `image_data` (one data URL per image, in prompt order) beside the
`input_ids` that already hold the expanded placeholders, and the ledger's logprobs are the
model's with the image in context. The vllm engine refuses images with a 400."""

from __future__ import annotations

import asyncio
import base64
import io

import openai
import pytest
import torch
from PIL import Image as PILImage

from rowgrove.engines import make_engine
from rowgrove.engines.base import teacher_forced_logprobs
from rowgrove.gateway.testing import start_gateway
from rowgrove.media import load_url
from rowgrove.standins import launch_standin


def _png(color) -> str:
    buf = io.BytesIO()
    PILImage.new("RGB", (70, 90), color).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def hf():
    torch.set_num_threads(1)
    engine = make_engine("hf", "tiny-vl")
    yield engine
    asyncio.run(engine.aclose())


def test_sglang_gets_image_data_with_input_ids(hf, tmp_path):
    server = launch_standin("sglang", "tiny-vl", engine=hf)
    try:
        engine = make_engine("sglang", "tiny-vl", url=server.url)
        url = _png((220, 40, 40))
        with start_gateway("tiny-vl", engine=engine, ledger=tmp_path / "l.db") as gw:
            ro = gw.create_rollout("g")
            cli = openai.OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            cli.chat.completions.create(model="tiny-vl", max_tokens=5, messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what?"}]}])
            (call,) = gw.ledger.calls(ro["rollout_id"])
        body = server.state.requests[-1]
        assert body["input_ids"] == call.prompt_ids.tolist()
        (sent,) = body["image_data"]
        assert load_url(sent).digest == load_url(url).digest
        assert call.prompt_ids.tolist().count(hf.vision.image_token_id) == hf.vision.tokens_for(load_url(url))
        lp, _ = teacher_forced_logprobs(hf.model, call.prompt_ids.tolist(), call.sampled_ids.tolist(),
                                        vision_inputs=hf.vision.pixel_inputs([load_url(url)]))
        torch.testing.assert_close(torch.tensor(call.logprobs.tolist()), torch.tensor(lp), atol=1e-4, rtol=1e-4)
        asyncio.run(engine.aclose())
    finally:
        server.close()


def test_vllm_refuses_images_with_a_400(hf, tmp_path):
    server = launch_standin("vllm", "tiny-vl", engine=hf)
    try:
        engine = make_engine("vllm", "tiny-vl", url=server.url)
        with start_gateway("tiny-vl", engine=engine, ledger=tmp_path / "l.db") as gw:
            ro = gw.create_rollout("g")
            cli = openai.OpenAI(base_url=ro["base_url"], api_key=ro["api_key"], max_retries=0)
            with pytest.raises(openai.BadRequestError, match="does not pass images"):
                cli.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": _png((1, 2, 3))}}, {"type": "text", "text": "x"}]}])
            assert gw.ledger.calls(ro["rollout_id"]) == []  # refused before the ledger
        asyncio.run(engine.aclose())
    finally:
        server.close()
