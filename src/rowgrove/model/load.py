"""Loading a tokenizer and model by one spec string: `tiny` (ChatML), `tiny-chatml`, `tiny-qwen3`,
`tiny-llama3` (the offline tiny model, built or reused from the cache), or the path of a Hugging
Face model directory. The same code path serves both, so the gateway and engines never special-
case the tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgrove.errors import InputError
from rowgrove.model.turns import (  # noqa: F401 (re-exported: callers import them from here)
    end_of_turn_id,
    folder_tokenizer,
    generation_eos_ids,
    stop_token_ids,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

TINY_SPECS = {"tiny": "chatml", "tiny-chatml": "chatml", "tiny-qwen3": "qwen3", "tiny-llama3": "llama3"}
TINY_VL_SPECS = ("tiny-vl",)  # the tiny Qwen2-VL-style vision-language model (rowgrove.model.tiny_vl)

def model_dir(spec: str) -> Path:
    """The directory a spec names (building the tiny model if needed); InputError if none."""
    if spec in TINY_SPECS:
        from rowgrove.model.tiny import tiny_model_dir

        return tiny_model_dir(TINY_SPECS[spec])
    if spec in TINY_VL_SPECS:
        from rowgrove.model.tiny_vl import tiny_vl_dir

        return tiny_vl_dir()
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise InputError(
            f"model {spec!r} is neither a tiny spec ({', '.join([*TINY_SPECS, *TINY_VL_SPECS])}) nor a Hugging Face "
            "model directory (no config.json or tokenizer.json there): pass one of those"
        )
    return path


def load_tokenizer(spec: str) -> PreTrainedTokenizerFast:
    """The fast tokenizer of `spec`, with its chat template. Raises InputError for a tokenizer
    without a chat template (rowgrove renders every request through it)."""
    return folder_tokenizer(model_dir(spec), spec)


def load_model(spec: str, *, device: str = "cpu", dtype: Any = None) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """(model in eval mode on `device`, tokenizer) for `spec`. `dtype` None keeps the checkpoint's
    dtype (float32 for the tiny model); a string such as "bfloat16" or a torch.dtype is accepted."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    tok = load_tokenizer(spec)
    if isinstance(dtype, str):
        try:
            dtype = getattr(torch, dtype)
        except AttributeError:
            raise InputError(f"unknown dtype {dtype!r}: use e.g. float32, bfloat16") from None
    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
    folder = model_dir(spec)
    from rowgrove.model.vision import is_vision_model

    if is_vision_model(folder):  # a VLM: its vision tower is part of the model, not a causal LM
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(str(folder), **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    model.to(device)
    model.eval()
    return model, tok
