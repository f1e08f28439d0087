"""The tiny VLM (`--model tiny-vl`): a real transformers Qwen2-VL architecture with its image
processor and a Qwen2-VL-style template, built offline; rebuilds are byte-identical; its three
tokenizer loaders agree; the placeholder count is the processor's for every image size."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgrove.model.load import load_tokenizer, model_dir
from rowgrove.model.tiny_vl import build_tiny_vl
from rowgrove.model.vision import Vision, is_vision_model, load_processor


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.slow
def test_rebuilds_are_byte_identical(tmp_path):
    a = build_tiny_vl(tmp_path / "a")
    b = build_tiny_vl(tmp_path / "b")
    assert _files(a) == _files(b)
    assert is_vision_model(a) and (a / "processor_config.json").is_file()


def test_tokenizers_agree_and_counts_are_the_processors():
    import io

    from PIL import Image as PILImage
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from rowgrove.media import decode_image

    folder = model_dir("tiny-vl")
    tok = load_tokenizer("tiny-vl")
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>how many? 42<|im_end|>\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == PreTrainedTokenizerFast.from_pretrained(str(folder))(text, add_special_tokens=False)["input_ids"]
    assert ids == Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    processor = load_processor(folder, tok)
    vision = Vision(processor)
    for w, h in [(28, 28), (56, 56), (90, 60), (300, 40), (500, 500), (13, 200)]:
        buf = io.BytesIO()
        PILImage.new("RGB", (w, h), (w % 256, h % 256, 7)).save(buf, "PNG")
        img = decode_image(buf.getvalue())
        enc = processor(text=[text], images=[img.pil()])
        assert enc["input_ids"][0] == tok(vision.expand(text, [img]), add_special_tokens=False)["input_ids"]
        assert 4 <= vision.tokens_for(img) <= 16  # the pixel budget: 56x56 to 112x112 after resizing
