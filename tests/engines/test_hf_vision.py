"""The hf engine on the tiny VLM: a request with an image samples a turn whose reported logprobs
are the model's own with the image in context (checked by one teacher-forced pass), and the
image changes them (the pixels reach the vision tower)."""

from __future__ import annotations

import asyncio
import io

import pytest
import torch
from PIL import Image as PILImage

from rowgrove.engines import make_engine
from rowgrove.engines.base import SamplingParams, teacher_forced_logprobs
from rowgrove.media import decode_image


def _img(color):
    buf = io.BytesIO()
    PILImage.new("RGB", (80, 60), color).save(buf, "PNG")
    return decode_image(buf.getvalue())


@pytest.fixture(scope="module")
def engine():
    torch.set_num_threads(1)
    eng = make_engine("hf", "tiny-vl")
    yield eng
    asyncio.run(eng.aclose())


def test_a_request_with_an_image_reports_the_models_logprobs(engine):
    img = _img((200, 10, 10))
    text = engine.vision.expand("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"
                                "<|im_start|>assistant\n", [img])
    prompt = engine.tokenizer(text, add_special_tokens=False)["input_ids"]
    gen = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=6, seed=3), hints={"images": [img]}))
    assert 1 <= len(gen.token_ids) <= 6
    pixels = engine.vision.pixel_inputs([img])
    lp, _ = teacher_forced_logprobs(engine.model, prompt, gen.token_ids, vision_inputs=pixels)
    torch.testing.assert_close(torch.tensor(gen.logprobs), torch.tensor(lp), atol=1e-4, rtol=1e-4)
    other, _ = teacher_forced_logprobs(engine.model, prompt, gen.token_ids,
                                       vision_inputs=engine.vision.pixel_inputs([_img((10, 10, 200))]))
    assert lp != other
