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
TINY_VL_SPECS = ("tiny-vl",)  # the tiny Qwen2-VL-style vision-language model (rowgrove.model.tiny_vl)

# End-of-turn tokens of the chat formats rowgrove knows, most specific first: the token a
# template writes after an assistant turn, which the model samples to end it.
_END_OF_TURN_CANDIDATES = (
    "<|im_end|>", "<|eot_id|>", "<|return|>", "<|end|>", "<end_of_turn>", "<｜end▁of▁sentence｜>",
    "<|end_of_text|>", "<|endoftext|>", "<|user|>",
)
# Tokens that end a model turn in some family, used only when the model folder has no
# generation_config.json eos list: Llama's <|eom_id|> (after a built-in tool call), harmony's
# <|call|> / <|return|>, GLM's next-message headers <|user|> / <|observation|>, Gemma's
# <end_of_turn>, DeepSeek's end of sentence, Kimi's <|im_end|>.
_STOP_CANDIDATES = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<｜end▁of▁sentence｜>", "<|user|>", "<|observation|>", "</s>",
)


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


def end_of_turn_id(tokenizer: PreTrainedTokenizerFast) -> int:
    """The id the model samples to end an ordinary reply: the chat format's end-of-turn token
    when the chat template writes one (`<|im_end|>`, `<|eot_id|>`, harmony's `<|return|>`, ...),
    otherwise the eos token. The full set of ids that end a turn is `stop_token_ids`."""
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocab = tokenizer.get_vocab()
    for tok in _END_OF_TURN_CANDIDATES:
        if tok == "<|end|>" and "<|return|>" in vocab:
            continue  # harmony: <|end|> ends a message inside a turn, not the turn
        if tok in template and tok in vocab:
            return vocab[tok]
    if tokenizer.eos_token_id is None:
        raise InputError("tokenizer has no end-of-turn or eos token: set eos_token in tokenizer_config.json")
    return int(tokenizer.eos_token_id)


def generation_eos_ids(folder: str | Path) -> list[int] | None:
    """`eos_token_id` of the folder's generation_config.json as a list (it may be one id or a
    list), or None when the folder has none. InputError for a file that is not valid JSON."""
    import json

    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{path} is not valid JSON ({e}): fix or remove it") from None
    eos = cfg.get("eos_token_id") if isinstance(cfg, dict) else None
    if eos is None:
        return None
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise InputError(f"{path}: eos_token_id must be an id or a list of ids, got {eos!r}")
    return [int(i) for i in ids]


def stop_token_ids(tokenizer: PreTrainedTokenizerFast, folder: str | Path | None = None) -> list[int]:
    """Every id that ends a model turn, as the engine's server stops on them: the model folder's
    generation_config.json `eos_token_id` list (Llama 3.1: <|end_of_text|> <|eom_id|> <|eot_id|>;
    gpt-oss: <|return|> <|endoftext|> <|call|>; GLM-4.6: <|endoftext|> <|user|> <|observation|>),
    the tokenizer's eos, and the chat format's end-of-turn token. Without a generation config, the
    known turn-ending tokens the template writes are added (harmony's <|end|> never is: it ends a
    message inside a turn). `folder` defaults to the folder the tokenizer was loaded from.
    First the end-of-turn id, then ascending."""
    if folder is None:
        name = getattr(tokenizer, "name_or_path", None)
        folder = name if name and Path(str(name)).is_dir() else None
    ids: set[int] = set()
    listed = generation_eos_ids(folder) if folder is not None else None
    if listed is not None:
        ids.update(listed)
    else:
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in _STOP_CANDIDATES if t in template and t in vocab)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    first = end_of_turn_id(tokenizer)
    ids.discard(first)
    return [first, *sorted(ids)]
