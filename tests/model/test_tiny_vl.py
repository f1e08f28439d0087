"""The tiny VLM (`--model tiny-vl`): a real transformers Qwen2-VL architecture with its image
processor and a Qwen2-VL-style template, built offline; rebuilds are byte-identical; its three
tokenizer loaders agree; the placeholder count is the processor's for every image size; the folder loads with
AutoProcessor (with torchvision the stock Qwen2VLProcessor, without it the folder's image-only module)."""

from __future__ import annotations

import importlib.util
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


# -- AutoProcessor: the folder loads the way a Hub Qwen2-VL checkpoint does ------------------------

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def _png(w: int, h: int):
    import io

    from PIL import Image as PILImage

    from rowgrove.media import decode_image

    buf = io.BytesIO()
    PILImage.new("RGB", (w, h), (w % 256, h % 256, 7)).save(buf, "PNG")
    return decode_image(buf.getvalue())


def test_processor_files_name_transformers_qwen2_vl_processor():
    import json

    folder = model_dir("tiny-vl")
    pcfg = json.loads((folder / "processor_config.json").read_text())
    assert pcfg["processor_class"] == "Qwen2VLProcessor"
    assert pcfg["auto_map"] == {"AutoProcessor": "processing_rowgrove_tiny_vl.ImageQwen2VLProcessor"}
    assert json.loads((folder / "tokenizer_config.json").read_text())["processor_class"] == "Qwen2VLProcessor"
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    assert pre == dict(pcfg["image_processor"], processor_class="Qwen2VLProcessor")
    assert pre["size"] == {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}


def test_auto_image_processor_takes_the_pil_backend_without_torchvision():
    from transformers import AutoImageProcessor

    folder = model_dir("tiny-vl")
    explicit = AutoImageProcessor.from_pretrained(str(folder), backend="pil")
    assert type(explicit).__name__ == "Qwen2VLImageProcessorPil"
    assert explicit.size == {"shortest_edge": 56 * 56, "longest_edge": 112 * 112} and explicit.merge_size == 2
    if not HAS_TORCHVISION:  # the default backend is torchvision's; without it transformers falls back to PIL
        assert type(AutoImageProcessor.from_pretrained(str(folder))).__name__ == "Qwen2VLImageProcessorPil"


def test_auto_processor_with_trust_remote_code_is_rowgroves_processor():
    """Without torchvision (this environment) the folder's own image-only module is the way in; with
    it, the same call loads it too. Its ids are rowgrove's, image for image."""
    from transformers import AutoProcessor, Qwen2VLProcessor

    folder = model_dir("tiny-vl")
    auto = AutoProcessor.from_pretrained(str(folder), trust_remote_code=True)
    assert isinstance(auto, Qwen2VLProcessor) and type(auto).__name__ == "ImageQwen2VLProcessor"
    assert auto.image_processor is not None and auto.image_processor.merge_size == 2
    assert getattr(auto, "video_processor", None) is None
    ours = load_processor(folder, load_tokenizer("tiny-vl"))
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "how many? 42"}]}]
    text = auto.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == ours.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.count("<|image_pad|>") == 1
    vision = Vision(ours)
    for w, h in [(28, 28), (90, 60), (300, 40), (500, 500)]:
        img = _png(w, h)
        got = auto(text=[text], images=[img.pil()])
        want = ours(text=[text], images=[img.pil()])
        assert got["input_ids"] == want["input_ids"]
        assert got["input_ids"][0].count(auto.image_token_id) == vision.tokens_for(img)
        assert got["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
        assert got["pixel_values"].shape == want["pixel_values"].shape


@pytest.mark.skipif(HAS_TORCHVISION, reason="torchvision is installed: AutoProcessor builds the stock processor")
def test_auto_processor_without_torchvision_says_what_it_needs():
    from transformers import AutoProcessor

    with pytest.raises(ImportError, match="Qwen2VLVideoProcessor requires the Torchvision library"):
        AutoProcessor.from_pretrained(str(model_dir("tiny-vl")))


@pytest.mark.skipif(not HAS_TORCHVISION, reason="needs torchvision: Qwen2-VL's video processor is built on it")
def test_auto_processor_with_torchvision_is_the_stock_qwen2_vl_processor():
    from transformers import AutoProcessor, Qwen2VLProcessor

    folder = model_dir("tiny-vl")
    auto = AutoProcessor.from_pretrained(str(folder))
    assert type(auto) is Qwen2VLProcessor and auto.image_processor is not None
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>how many?<|im_end|>\n"
    img = _png(90, 60)
    assert auto(text=[text], images=[img.pil()])["input_ids"] == \
        load_processor(folder, load_tokenizer("tiny-vl"))(text=[text], images=[img.pil()])["input_ids"]
