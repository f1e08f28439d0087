"""A vision-language model's image side, as the gateway, the engines and the trainer need it: the
processor (Qwen2-VL's image processor and its placeholder expansion), how many placeholder tokens
an image becomes, and the pixel tensors the model's vision tower takes.

Qwen2-VL / Qwen2.5-VL write one `<|image_pad|>` per image in the chat template's text; the
processor (`Qwen2VLProcessor.__call__`) replaces each, in order, by `grid_t * grid_h * grid_w /
merge_size**2` pads, the grid set by the image's size after `smart_resize` (a multiple of
patch_size * merge_size per side, the pixel count kept within min_pixels..max_pixels).
`Vision.expand` does exactly that replacement on the rendered text, so the ids the gateway
tokenizes are the processor's own; `tests/gateway/test_http_images.py` checks it against
`processor.apply_chat_template` + `processor(...)` call by call.

Why a subclass of `Qwen2VLProcessor`: transformers 5.23 builds that processor with a video
processor, and its video processor needs torchvision, which has no CPU wheel for this torch. The
subclass drops only the video side (`ImageQwen2VLProcessor`: same `__call__`, same
`replace_image_token`, same image processor); image inputs go through transformers' own code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgrove.errors import BadRequest, InputError

if TYPE_CHECKING:
    from rowgrove.media import Image

IMAGE_TOKEN = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
VIDEO_TOKEN = "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN)


def _processor_class() -> type:
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    class ImageQwen2VLProcessor(Qwen2VLProcessor):
        """`Qwen2VLProcessor` for images only (no video processor, which needs torchvision)."""

        def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: str | None = None,
                     **kwargs: Any):
            self.image_token = IMAGE_TOKEN
            self.video_token = VIDEO_TOKEN
            self.image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
            self.video_token_id = tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
            ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    return ImageQwen2VLProcessor


_CLASS: type | None = None


def processor_class() -> type:
    """The image-only Qwen2-VL processor class (built once; importing it imports transformers)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _processor_class()
    return _CLASS


def is_vision_model(folder: str | Path) -> bool:
    """Whether the model folder holds a Qwen2-VL-style model with an image processor."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and cfg.get("model_type") in ("qwen2_vl", "qwen2_5_vl") \
        and (folder / "processor_config.json").is_file()


def load_processor(folder: str | Path, tokenizer: Any = None) -> Any:
    """The processor saved in `folder` (its image processor settings and chat template), sharing
    `tokenizer` when given."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(folder)
    try:
        cfg = json.loads((folder / "processor_config.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{folder}/processor_config.json cannot be read ({e}): rebuild the model") from None
    ip_cfg = dict(cfg.get("image_processor") or {})
    ip_cfg.pop("image_processor_type", None)
    ip_cfg.pop("processor_class", None)
    image_processor = Qwen2VLImageProcessorPil(**ip_cfg)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    return processor_class()(image_processor=image_processor, tokenizer=tokenizer,
                             chat_template=tokenizer.chat_template)


def vision_of(tokenizer: Any) -> Vision | None:
    """The `Vision` of the model folder `tokenizer` was loaded from when it is a vision model,
    else None (what an engine uses to turn images into the model's pixel inputs)."""
    name = getattr(tokenizer, "name_or_path", None)
    if not name or not Path(str(name)).is_dir() or not is_vision_model(name):
        return None
    return Vision(load_processor(name, tokenizer))


def model_kwargs(input_ids: Any, vision_inputs: Any) -> dict[str, Any]:
    """The keyword arguments a Qwen2-VL forward pass over `input_ids` (B, S) takes for its images
    (`Vision.pixel_inputs`): pixel_values, image_grid_thw and `mm_token_type_ids` (1 at image
    placeholders, as the processor returns it), on the ids' device. Empty without images."""
    if not vision_inputs:
        return {}
    dev = input_ids.device
    return {"pixel_values": vision_inputs["pixel_values"].to(dev),
            "image_grid_thw": vision_inputs["image_grid_thw"].to(dev),
            "mm_token_type_ids": (input_ids == int(vision_inputs["image_token_id"])).long()}


class Vision:
    """The image side of one served VLM: placeholder counts, expansion, pixel tensors.

    `processor` is the model's processor (`load_processor`). Counts are memoized by image size.
    `folder`: the folder `file://` image URLs may be read from (None: refused); `lookup(digest)`
    finds a stored image (`rowgrove-media:` URLs) that this process has not decoded.
    """

    def __init__(self, processor: Any, *, folder: str | Path | None = None, lookup: Any = None):
        self.processor = processor
        self.folder = folder
        self.lookup = lookup
        self.image_token = processor.image_token
        self.image_token_id = int(processor.image_token_id)
        self.merge_size = int(processor.image_processor.merge_size)
        self._counts: dict[tuple[int, int], int] = {}

    def tokens_for(self, img: Image) -> int:
        """How many `<|image_pad|>` the processor writes for `img` (set by its size alone)."""
        key = (img.height, img.width)
        n = self._counts.get(key)
        if n is None:
            data = self.processor._get_num_multimodal_tokens(image_sizes=[key])
            n = int(data["num_image_tokens"][0])
            self._counts[key] = n
        return n

    def expand(self, text: str, images: Sequence[Image]) -> str:
        """`text` with its k-th image token repeated `tokens_for(images[k])` times, as the
        processor's `__call__` does. BadRequest when the template wrote another number of image
        tokens than there are images (a template that drops an image)."""
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(images):
            raise BadRequest(
                f"the chat template wrote {len(pieces) - 1} image placeholders for {len(images)} images: "
                "send images only in user messages", param="messages")
        if not images:
            return text
        out = [pieces[0]]
        for img, piece in zip(images, pieces[1:], strict=True):
            out.append(self.image_token * self.tokens_for(img))
            out.append(piece)
        return "".join(out)

    def pixel_inputs(self, images: Sequence[Image]) -> dict[str, Any]:
        """`pixel_values` and `image_grid_thw` (torch tensors) of `images`, in order, as the
        processor makes them for the model's forward pass."""
        out = self.processor.image_processor(images=[img.pil() for img in images], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"],
                "image_token_id": self.image_token_id}

    def config_record(self) -> dict[str, Any]:
        """What reproduces the processed form of a stored image: the processor's class, its
        image processor's settings and the transformers version."""
        import transformers

        ip = self.processor.image_processor.to_dict()
        return {"processor": "Qwen2VLProcessor (image side)", "image_processor": ip,
                "transformers": transformers.__version__}


__all__ = ["IMAGE_TOKEN", "VISION_TOKENS", "Vision", "is_vision_model", "load_processor", "processor_class"]
