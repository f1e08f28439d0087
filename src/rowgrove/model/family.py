"""Tiny offline stand-ins for real model families: the tiny model's byte-level BPE (trained on the
spot by `rowgrove.model.tiny`), given one family's special and added tokens, its real chat
template, its bos / eos / pad, and a `generation_config.json` whose `eos_token_id` is the list of
stop ids (as real Qwen3, Llama 3.1, GLM and gpt-oss folders have it), plus a random-init
Llama-architecture model with embeddings sized to that vocabulary. The result is an ordinary
Hugging Face model folder: `AutoTokenizer` / `AutoModelForCausalLM` / `rowgrove.model.load` load
it like a downloaded checkpoint.

The vocabulary holds the family's tokens only: the tiny tokenizer's own ChatML / Llama-3 /
hermes tokens are removed (and the BPE ids renumbered) unless the family lists them, so a
Mistral-like folder has no `<|im_end|>` and a Llama-like one has no `<tool_call>`. Ids: the BPE
vocabulary first, then `special_tokens` (special AddedTokens), then `extra_tokens` (non-special
AddedTokens); both kinds are whole tokens that split text (normalized=False, no lstrip/rstrip).

`add_bos=True` makes the tokenizer prepend the bos token when `add_special_tokens=True`, as the
real Llama 3.1, Mistral and DeepSeek tokenizers do (their templates write `bos_token` too, so
encoding a rendering without `add_special_tokens=False` doubles it, as with the real models).

Builds are deterministic (same arguments -> byte-identical files) and cached: a folder holding a
complete build with the same configuration hash (`rowgrove-family.json`, written last) is reused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from rowgrove.errors import InputError
from rowgrove.model import tiny

FAMILY_BUILDER_VERSION = 1
MARKER = "rowgrove-family.json"
_BASE_VOCAB = 1024  # BPE vocabulary of the tiny tokenizer, before the family's tokens


def _dedupe(items: Sequence[str | None]) -> list[str]:
    out: list[str] = []
    for t in items:
        if t is not None and t not in out:
            out.append(t)
    return out


def _resolve(special_tokens: Sequence[str], extra_tokens: Sequence[str], eos_tokens: Sequence[str],
             eos_token: str | None, bos_token: str | None, pad_token: str | None) -> tuple[list[str], list[str], str]:
    """(special tokens, extra tokens, tokenizer eos), validated. bos/pad/eos tokens missing from
    both lists become special tokens; a token in both lists is special."""
    if isinstance(special_tokens, str) or isinstance(extra_tokens, str) or isinstance(eos_tokens, str):
        raise InputError("special_tokens, extra_tokens and eos_tokens are sequences of token strings, not one string")
    if not eos_tokens:
        raise InputError("eos_tokens is empty: pass the tokens the model stops on (generation_config eos_token_id)")
    eos = eos_token if eos_token is not None else eos_tokens[0]
    extra = [t for t in _dedupe(extra_tokens) if t not in special_tokens]
    specials = _dedupe([*special_tokens, *(t for t in (bos_token, pad_token, eos, *eos_tokens) if t not in extra)])
    for t in specials + extra:
        if not isinstance(t, str) or not t:
            raise InputError(f"token {t!r} is not a non-empty string")
    return specials, extra, eos


def family_config_hash(*, chat_template: str, special_tokens: Sequence[str], eos_tokens: Sequence[str],
                       eos_token: str | None = None, bos_token: str | None = None, pad_token: str | None = None,
                       extra_tokens: Sequence[str] = (), add_bos: bool = False, seed: int = 0, layers: int = 2,
                       hidden: int = 64, heads: int = tiny.DEFAULT_HEADS,
                       tie_embeddings: bool = tiny.DEFAULT_TIE) -> str:
    """A short hash naming one family-model configuration, the family builder version and the
    tiny tokenizer it starts from."""
    specials, extra, eos = _resolve(special_tokens, extra_tokens, eos_tokens, eos_token, bos_token, pad_token)
    base = tiny.config_hash(template="chatml", seed=seed, layers=layers, hidden=hidden,
                            vocab_size=_BASE_VOCAB, extra_corpus=())
    cfg = {"builder": FAMILY_BUILDER_VERSION, "base": base, "chat_template": chat_template,
           "special": specials, "extra": extra, "eos_tokens": list(eos_tokens), "eos": eos,
           "bos": bos_token, "pad": pad_token, "add_bos": add_bos, "seed": seed,
           "layers": layers, "hidden": hidden}
    if heads != tiny.DEFAULT_HEADS:  # only when not the default, so default builds keep their names
        cfg["heads"] = heads
    if tie_embeddings != tiny.DEFAULT_TIE:
        cfg["tie_embeddings"] = tie_embeddings
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def _family_tokenizer(seed: int, specials: Sequence[str], extra: Sequence[str], bos: str | None, add_bos: bool):
    """The tiny BPE without its own added tokens, plus the family's (a tokenizers.Tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, processors

    base = tiny._train_tokenizer(seed, _BASE_VOCAB, ())
    spec = json.loads(base.to_str())
    own = {t["content"] for t in spec["added_tokens"]}
    kept = sorted((i, t) for t, i in spec["model"]["vocab"].items() if t not in own)
    spec["model"]["vocab"] = {t: n for n, (_, t) in enumerate(kept)}
    spec["added_tokens"] = []
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                                       single_word=False) for t in specials])
    tok.add_tokens([AddedToken(t, special=False, normalized=False, lstrip=False, rstrip=False,
                               single_word=False) for t in extra])
    if add_bos:
        if bos is None:
            raise InputError("add_bos=True needs a bos_token")
        bos_id = tok.token_to_id(bos)
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
                                          special_tokens=[(bos, bos_id)]),
        ])
    return tok


def _write(out: Path, *, chat_template: str, specials: list[str], extra: list[str], eos_tokens: Sequence[str],
           eos: str, bos: str | None, pad: str | None, add_bos: bool, seed: int, layers: int, hidden: int,
           chash: str, heads: int = tiny.DEFAULT_HEADS, tie_embeddings: bool = tiny.DEFAULT_TIE) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = _family_tokenizer(seed, specials, extra, bos, add_bos)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=bos, eos_token=eos, pad_token=pad,
        model_max_length=8192, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out)

    def tid(t: str | None) -> int | None:
        return None if t is None else raw.token_to_id(t)

    eos_ids = [tid(t) for t in eos_tokens]
    n_heads, n_kv = tiny.attention_layout(hidden, heads)
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=n_heads, num_key_value_heads=n_kv,
        max_position_embeddings=8192, tie_word_embeddings=tie_embeddings,
        bos_token_id=tid(bos), eos_token_id=eos_ids, pad_token_id=tid(pad),
    )
    config.tokenizer_class = "PreTrainedTokenizerFast"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tid(pad), bos_token_id=tid(bos), do_sample=True,
    )
    model.save_pretrained(out, safe_serialization=True)
    # tokenizer_config.json: make AutoTokenizer load the generic fast class, never a model's own.
    cfg_path = out / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    marker = {"config_hash": chash, "eos_tokens": list(eos_tokens), "special_tokens": specials, "extra_tokens": extra,
              "bos": bos, "eos": eos, "pad": pad, "add_bos": add_bos, "seed": seed, "layers": layers, "hidden": hidden}
    if heads != tiny.DEFAULT_HEADS or tie_embeddings != tiny.DEFAULT_TIE:
        marker.update(heads=heads, tie_embeddings=tie_embeddings)
    (out / MARKER).write_text(json.dumps(marker, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _complete_hash(path: Path) -> str | None:
    try:
        return json.loads((path / MARKER).read_text(encoding="utf-8"))["config_hash"]
    except (OSError, ValueError, KeyError):
        return None


def build_family_model(out_dir: str | Path, *, chat_template: str, special_tokens: Sequence[str],
                       eos_tokens: Sequence[str], bos_token: str | None = None, pad_token: str | None = None,
                       extra_tokens: Sequence[str] = (), seed: int = 0, eos_token: str | None = None,
                       add_bos: bool = False, layers: int = 2, hidden: int = 64, heads: int = tiny.DEFAULT_HEADS,
                       tie_embeddings: bool = tiny.DEFAULT_TIE) -> Path:
    """Build a tiny model of one family into `out_dir` and return it as a Path.

    `special_tokens` become special added tokens, `extra_tokens` non-special ones; `bos_token`,
    `pad_token` and the `eos_tokens` are added as special tokens when neither list has them.
    `eos_tokens` are the ids written to generation_config.json / config.json `eos_token_id` (a
    list, in this order); `eos_token` is the tokenizer's eos (tokenizer_config.json), by default
    `eos_tokens[0]`. `chat_template` is saved as chat_template.jinja. `add_bos`: the tokenizer
    prepends `bos_token` when asked to add special tokens. `heads` / `tie_embeddings`: as in
    `rowgrove.model.tiny.build_tiny_model` (`**tiny.servable_kwargs()` gives a folder vLLM's CPU
    engine can serve).

    Deterministic (same arguments -> byte-identical files) and cached: a folder already holding a
    complete build of the same configuration is returned untouched; a folder holding another
    family build is replaced; a non-empty folder that is not one is refused (InputError). Safe
    against concurrent builders: the build happens in a sibling temp dir and is renamed in.
    """
    if not isinstance(chat_template, str) or not chat_template.strip():
        raise InputError("chat_template must be the Jinja text of a chat template")
    if hidden % 4 or hidden < 8 or layers < 1:
        raise InputError("family model needs hidden a multiple of 4 (>= 8) and layers >= 1, "
                         f"got hidden={hidden}, layers={layers}")
    tiny.attention_layout(hidden, heads)
    specials, extra, eos = _resolve(special_tokens, extra_tokens, eos_tokens, eos_token, bos_token, pad_token)
    chash = family_config_hash(chat_template=chat_template, special_tokens=special_tokens, eos_tokens=eos_tokens,
                               eos_token=eos_token, bos_token=bos_token, pad_token=pad_token,
                               extra_tokens=extra_tokens, add_bos=add_bos, seed=seed, layers=layers, hidden=hidden,
                               heads=heads, tie_embeddings=tie_embeddings)
    out = Path(out_dir)
    return tiny._build_cached(out, chash, lambda tmp: _write(
        tmp, chat_template=chat_template, specials=specials, extra=extra, eos_tokens=list(eos_tokens), eos=eos,
        bos=bos_token, pad=pad_token, add_bos=add_bos, seed=seed, layers=layers, hidden=hidden, chash=chash,
        heads=heads, tie_embeddings=tie_embeddings),
        complete_hash=_complete_hash, kind="family-model")
