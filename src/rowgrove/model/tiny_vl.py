"""The tiny vision-language model, built offline in seconds as the tiny text model is: the same
byte-level BPE tokenizer (plus Qwen2-VL's vision tokens), a Qwen2-VL-style chat template, a
random-init `Qwen2VLForConditionalGeneration` (2 text layers x 64 hidden, a 1-block vision tower
of 32 channels, patch 14, 2x2 merge) and Qwen2-VL's image processor with a small pixel budget
(56x56 to 112x112 after resizing: 4 to 16 placeholder tokens per image), saved as a normal HF
model directory with `processor_config.json`.

The folder loads the way a Hub Qwen2-VL checkpoint does. Its processor files name transformers'
own `Qwen2VLProcessor` (`processor_config.json`, `preprocessor_config.json` with the image
processor's settings, as Qwen/Qwen2-VL-2B-Instruct ships it, and `tokenizer_config.json`), so
`AutoProcessor.from_pretrained(folder)` builds it where torchvision is installed: transformers
5.23 builds Qwen2-VL's video processor, a required part of that processor, only on torchvision.
Where torchvision is missing, `AutoProcessor.from_pretrained(folder, trust_remote_code=True)`
loads `processing_rowgrove_tiny_vl.ImageQwen2VLProcessor` from the folder (its `auto_map`): the
same processor without the video side, with the PIL image processor (`Qwen2VLImageProcessorPil`).

Served as `--model tiny-vl` by the `hf` and `scripted` engines. Deterministic and cached like
`rowgrove.model.tiny` (same config -> byte-identical files; a complete build is reused).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rowgrove.model.templates import get_template
from rowgrove.model.tiny import CONTEXT, PAD_TOKEN, _build_cached, _complete_hash, _train_tokenizer, cache_root
from rowgrove.model.vision import VISION_TOKENS

BUILDER_VERSION = 3  # 2: the folder loads with AutoProcessor (processor files, auto_map); 3: 131,072 positions
MARKER = "rowgrove-tiny.json"
TEMPLATE = "qwen2-vl"
MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
PROCESSOR_CLASS = "Qwen2VLProcessor"  # transformers' own: what AutoProcessor builds with torchvision
REMOTE_MODULE = "processing_rowgrove_tiny_vl"
REMOTE_CLASS = "ImageQwen2VLProcessor"
# The module AutoProcessor(trust_remote_code=True) loads from the folder: self-contained (imports
# transformers only), the class rowgrove.model.vision.processor_class() builds.
REMOTE_SOURCE = '''"""Qwen2-VL's processor for images only, for the tiny VLM rowgrove builds.

transformers 5.23 builds `Qwen2VLProcessor` with a video processor, and Qwen2-VL's video
processor needs torchvision. This subclass drops only the video side: same `__call__`, same
placeholder expansion (`replace_image_token`), same image processor. Loaded by
`AutoProcessor.from_pretrained(folder, trust_remote_code=True)` through the folder's `auto_map`.
"""

from transformers import Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin


class ImageQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` for images only (no video processor, which needs torchvision)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = "<|image_pad|>"
        self.video_token = "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)
'''


def config_hash(*, seed: int, layers: int, hidden: int, vocab_size: int, min_pixels: int, max_pixels: int) -> str:
    """A short hash naming one tiny-vl configuration (and the builder version)."""
    cfg = {"builder": BUILDER_VERSION, "kind": "tiny-vl", "seed": seed, "layers": layers, "hidden": hidden,
           "vocab_size": vocab_size, "min_pixels": min_pixels, "max_pixels": max_pixels}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def _write(out: Path, *, seed: int, layers: int, hidden: int, vocab_size: int, min_pixels: int,
           max_pixels: int, chash: str) -> None:
    import torch
    from tokenizers import AddedToken
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from transformers.utils import logging as hf_logging

    from rowgrove.model.vision import processor_class

    hf_logging.disable_progress_bar()
    spec = get_template(TEMPLATE)
    raw = _train_tokenizer(seed, vocab_size, ())
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=spec.end_of_turn, pad_token=PAD_TOKEN,
        model_max_length=CONTEXT, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = spec.jinja
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    processor = processor_class()(image_processor=image_processor, tokenizer=tokenizer, chat_template=spec.jinja)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)

    eot = raw.token_to_id(spec.end_of_turn)
    pad = raw.token_to_id(PAD_TOKEN)
    heads = 4
    half = hidden // heads // 2  # rotary frequencies per head, split over (time, height, width)
    section = [half - 2 * (half // 3), half // 3, half // 3]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": raw.get_vocab_size(), "hidden_size": hidden, "intermediate_size": hidden * 2,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": 2,
            "max_position_embeddings": CONTEXT, "eos_token_id": eot, "pad_token_id": pad, "bos_token_id": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
        },
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": hidden, "num_heads": 2, "mlp_ratio": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
        image_token_id=raw.token_to_id("<|image_pad|>"), video_token_id=raw.token_to_id("<|video_pad|>"),
        vision_start_token_id=raw.token_to_id("<|vision_start|>"),
        vision_end_token_id=raw.token_to_id("<|vision_end|>"), tie_word_embeddings=True,
    )
    config.tokenizer_class = "PreTrainedTokenizerFast"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=eot, pad_token_id=pad, do_sample=True)
    model.save_pretrained(out, safe_serialization=True)
    cfg_path = out / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    tcfg["processor_class"] = PROCESSOR_CLASS
    cfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True) + "\n")
    _write_processor_files(out)
    (out / MARKER).write_text(json.dumps({"config_hash": chash, "kind": "tiny-vl", "template": TEMPLATE,
                                          "seed": seed, "layers": layers, "hidden": hidden,
                                          "vocab_size": vocab_size, "min_pixels": min_pixels,
                                          "max_pixels": max_pixels}, sort_keys=True) + "\n")


def _write_processor_files(out: Path) -> None:
    """Make the saved processor loadable by `AutoProcessor`: processor_config.json names
    transformers' `Qwen2VLProcessor` and maps `AutoProcessor` to the folder's image-only module
    (used only with trust_remote_code=True), preprocessor_config.json holds the image processor's
    settings (where AutoImageProcessor, AutoVideoProcessor and transformers 4.x look), and the
    module itself. Written with sorted keys: rebuilds stay byte-identical."""
    path = out / "processor_config.json"
    pcfg = json.loads(path.read_text())
    pcfg["processor_class"] = PROCESSOR_CLASS
    pcfg["auto_map"] = {"AutoProcessor": f"{REMOTE_MODULE}.{REMOTE_CLASS}"}
    path.write_text(json.dumps(pcfg, indent=2, sort_keys=True) + "\n")
    image = dict(pcfg["image_processor"], processor_class=PROCESSOR_CLASS)
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2, sort_keys=True) + "\n")
    (out / f"{REMOTE_MODULE}.py").write_text(REMOTE_SOURCE)


def build_tiny_vl(out_dir: str | Path, *, seed: int = 0, layers: int = 2, hidden: int = 64, vocab_size: int = 1024,
                  min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> Path:
    """Build the tiny VLM into `out_dir` and return it (deterministic, cached, safe against
    concurrent builders, as `build_tiny_model`)."""
    from rowgrove.errors import InputError

    if hidden % 4 or hidden < 32 or layers < 1:
        raise InputError(f"tiny-vl needs hidden a multiple of 4 (>= 32) and layers >= 1, got hidden={hidden}, layers={layers}")
    out = Path(out_dir)
    chash = config_hash(seed=seed, layers=layers, hidden=hidden, vocab_size=vocab_size,
                        min_pixels=min_pixels, max_pixels=max_pixels)
    return _build_cached(out, chash, lambda tmp: _write(tmp, seed=seed, layers=layers, hidden=hidden,
                                                        vocab_size=vocab_size, min_pixels=min_pixels,
                                                        max_pixels=max_pixels, chash=chash),
                         complete_hash=_complete_hash, kind="tiny-vl")


def tiny_vl_dir(seed: int = 0) -> Path:
    """The default tiny VLM under the cache root, built on first use."""
    chash = config_hash(seed=seed, layers=2, hidden=64, vocab_size=1024, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return build_tiny_vl(cache_root() / f"tiny-vl-{chash}", seed=seed)


__all__ = ["build_tiny_vl", "tiny_vl_dir"]
