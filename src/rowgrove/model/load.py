"""Loading a tokenizer and model by one spec string: `tiny` (ChatML), `tiny-chatml`, `tiny-qwen3`,
`tiny-llama3` (the offline tiny model, built or reused from the cache), or the path of a Hugging
Face model directory. The same code path serves both, so the gateway and engines never special-
case the tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgrove.errors import InputError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

TINY_SPECS = {"tiny": "chatml", "tiny-chatml": "chatml", "tiny-qwen3": "qwen3", "tiny-llama3": "llama3"}

# End-of-turn tokens of the chat formats rowgrove knows, most specific first.
_END_OF_TURN_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


def model_dir(spec: str) -> Path:
    """The directory a spec names (building the tiny model if needed); InputError if none."""
    if spec in TINY_SPECS:
        from rowgrove.model.tiny import tiny_model_dir

        return tiny_model_dir(TINY_SPECS[spec])
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file() and not (path / "tokenizer.json").is_file():
        raise InputError(
            f"model {spec!r} is neither a tiny spec ({', '.join(TINY_SPECS)}) nor a Hugging Face "
            "model directory (no config.json or tokenizer.json there): pass one of those"
        )
    return path


def load_tokenizer(spec: str) -> PreTrainedTokenizerFast:
    """The fast tokenizer of `spec`, with its chat template. Raises InputError for a tokenizer
    without a chat template (rowgrove renders every request through it)."""
    from transformers import AutoTokenizer

    path = model_dir(spec)
    tok = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tok, "is_fast", False):
        raise InputError(f"tokenizer of {spec!r} is not a fast tokenizer: rowgrove needs tokenizer.json")
    if not tok.chat_template:
        raise InputError(f"tokenizer of {spec!r} has no chat template: add chat_template.jinja to {path}")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


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
    model = AutoModelForCausalLM.from_pretrained(str(model_dir(spec)), **kwargs)
    model.to(device)
    model.eval()
    return model, tok


def end_of_turn_id(tokenizer: PreTrainedTokenizerFast) -> int:
    """The id the model samples to end its turn: the chat format's end-of-turn token when the
    chat template writes one (`<|im_end|>`, `<|eot_id|>`, ...), otherwise the eos token."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocab = tokenizer.get_vocab()
    for tok in _END_OF_TURN_CANDIDATES:
        if tok in template and tok in vocab:
            return vocab[tok]
    if tokenizer.eos_token_id is None:
        raise InputError("tokenizer has no end-of-turn or eos token: set eos_token in tokenizer_config.json")
    return int(tokenizer.eos_token_id)
