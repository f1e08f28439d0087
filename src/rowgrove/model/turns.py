"""A model folder's fast tokenizer and the ids that end a model turn. Needs only the folder, so
the tiny-model builders (`model.tiny`, `model.tiny_vl`) use it without importing `model.load`,
which resolves a spec string and so imports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rowgrove.errors import InputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

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



def folder_tokenizer(path: str | Path, name: str | None = None) -> PreTrainedTokenizerFast:
    """The fast tokenizer in the model folder `path`, with its chat template (`name` is what the
    errors call it, the folder by default). Raises InputError for a slow tokenizer or one without a
    chat template (rowgrove renders every request through it). A tokenizer without a pad token gets
    its eos as pad."""
    from transformers import AutoTokenizer

    name = str(path) if name is None else name
    tok = _as_tokenizer_json(AutoTokenizer.from_pretrained(str(path)), Path(path))
    if not getattr(tok, "is_fast", False):
        raise InputError(f"tokenizer of {name!r} is not a fast tokenizer: rowgrove needs tokenizer.json")
    if not tok.chat_template:
        raise InputError(f"tokenizer of {name!r} has no chat template: add chat_template.jinja to {path}")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def _pipeline_types(parts: dict) -> tuple:
    """The types of a tokenizer.json's model, normalizer, pre-tokenizer and decoder (None if absent)."""
    return tuple((parts.get(k) or {}).get("type") for k in ("model", "normalizer", "pre_tokenizer", "decoder"))


def _as_tokenizer_json(tok: PreTrainedTokenizerFast, folder: Path) -> PreTrainedTokenizerFast:
    """`tok`, or the folder's tokenizer.json loaded as it is written when `tok` runs another pipeline.

    Why: rowgrove's ids must be the model's own (tokenizer.json's), under every transformers its range
    allows. Before 5.23, `AutoTokenizer` builds some tokenizers from the class their config names and
    replaces tokenizer.json's pre-tokenizer and decoder with that class's: DeepSeek V3's config names
    `LlamaTokenizerFast`, and transformers 5.10-5.19 load its byte-level BPE as a Metaspace
    `LlamaTokenizer` (other ids; decoding drops every space), where 5.23 keeps the file's pipeline.
    `PreTrainedTokenizerFast.from_pretrained` keeps the file's pipeline in each of them, with the
    config's special tokens and chat template. Compared by component type (a mismatch is a whole
    different pipeline, as here); a folder without tokenizer.json keeps `tok`."""
    import json

    file = folder / "tokenizer.json"
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None or not file.is_file():
        return tok
    want = _pipeline_types(json.loads(file.read_text(encoding="utf-8")))
    have = tuple(None if part is None else type(part).__name__
                 for part in (backend.model, backend.normalizer, backend.pre_tokenizer, backend.decoder))
    if have == want:
        return tok
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


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
