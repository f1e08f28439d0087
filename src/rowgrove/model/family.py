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

A real vocabulary instead (`tokenizer_dir`): a folder with a model's own `tokenizer.json` and
`tokenizer_config.json` (as its model repository ships them) is kept as it is, with the family's
template beside it as chat_template.jinja (the config's own `chat_template` field is dropped, so
there is one template), and the random model's embeddings are sized to that vocabulary: tiny
weights, real ids. `token_renames` ({id: token}) names added tokens the family's template needs
that the tokenizer at hand carries under another name, as a later release of the same vocabulary
does (Llama 3's reserved special tokens 128004/128008/128010 are Llama 3.1's
`<|finetune_right_pad_id|>`, `<|eom_id|>`, `<|python_tag|>`); every other id keeps its token.

Builds are deterministic (same arguments -> byte-identical files) and cached: a folder holding a
complete build with the same configuration hash (`rowgrove-family.json`, written last) is reused.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rowgrove.errors import InputError
from rowgrove.model import tiny

FAMILY_BUILDER_VERSION = 2  # 2: 131,072 positions (tiny.CONTEXT)
MARKER = "rowgrove-family.json"
_BASE_VOCAB = 1024  # BPE vocabulary of the tiny tokenizer, before the family's tokens
REAL_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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
                       tie_embeddings: bool = tiny.DEFAULT_TIE, tokenizer_dir: str | Path | None = None,
                       token_renames: Mapping[int, str] | None = None) -> str:
    """A short hash naming one family-model configuration, the family builder version and the
    tokenizer it starts from (the tiny one, or the sha256 of a real one's files and the renames)."""
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
    if tokenizer_dir is not None:  # only then, so tiny-vocabulary builds keep their names
        cfg["base"] = None
        cfg["tokenizer"] = {**_real_files_sha256(Path(tokenizer_dir)),
                            "renames": {str(k): v for k, v in sorted((token_renames or {}).items())}}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def _real_files_sha256(folder: Path) -> dict[str, str]:
    out = {}
    for f in REAL_TOKENIZER_FILES:
        try:
            out[f] = hashlib.sha256((folder / f).read_bytes()).hexdigest()
        except OSError as e:
            raise InputError(f"tokenizer_dir {folder} has no readable {f} ({e.strerror}): pass a folder with the "
                             "model's tokenizer.json and tokenizer_config.json") from None
    return out


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


def _real_tokenizer(folder: Path, out: Path, *, chat_template: str, specials: Sequence[str], extra: Sequence[str],
                    renames: Mapping[int, str]) -> None:
    """Write the real tokenizer of `folder` into `out`: tokenizer.json unchanged (but for the
    renamed added tokens), tokenizer_config.json without its own chat_template, and
    chat_template.jinja. InputError names a family token the vocabulary lacks."""
    raw_json = (folder / "tokenizer.json").read_bytes()
    spec = json.loads(raw_json)
    config: dict[str, Any] = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    by_id = {t["id"]: t for t in spec.get("added_tokens", [])}
    decoder = config.get("added_tokens_decoder") or {}
    for tid, content in sorted(renames.items()):
        if tid not in by_id:
            raise InputError(f"token_renames: id {tid} is not an added token of {folder / 'tokenizer.json'}")
        by_id[tid]["content"] = content
        by_id[tid]["special"] = content not in extra
        if str(tid) in decoder:
            decoder[str(tid)] = {**decoder[str(tid)], "content": content, "special": content not in extra}
    known = {t["content"] for t in by_id.values()} | set(spec.get("model", {}).get("vocab", {}))
    missing = [t for t in [*specials, *extra] if t not in known]
    if missing:
        raise InputError(f"the tokenizer in {folder} has no {', '.join(missing)}: the family's template needs "
                         "them; name the ids that stand for them with token_renames")
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_bytes(
        raw_json if not renames else json.dumps(spec, ensure_ascii=False, indent=2).encode("utf-8"))
    config.pop("chat_template", None)  # one template: the family's, in chat_template.jinja
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    (out / "chat_template.jinja").write_text(chat_template, encoding="utf-8")


def _write_real(out: Path, tokenizer_dir: Path, renames: Mapping[int, str], *, chat_template: str,
                specials: list[str], extra: list[str], eos_tokens: Sequence[str], eos: str, bos: str | None,
                pad: str | None, add_bos: bool, seed: int, layers: int, hidden: int, chash: str, heads: int,
                tie_embeddings: bool) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    _real_tokenizer(tokenizer_dir, out, chat_template=chat_template, specials=specials, extra=extra,
                    renames=renames)
    tok = AutoTokenizer.from_pretrained(str(out))
    seen = {"eos_token": (tok.eos_token, eos), "bos_token": (tok.bos_token, bos), "pad_token": (tok.pad_token, pad)}
    wrong = [f"{k} {have!r} (the family says {want!r})" for k, (have, want) in seen.items() if have != want]
    # add_bos is not checked: whether bos is prepended is the real tokenizer's own behaviour under
    # the installed transformers (DeepSeek V3's config asks for it, but transformers 5 loads its
    # ByteLevel tokenizer.json as TokenizersBackend, which does not add it); the templates write bos.
    if wrong:
        raise InputError(f"the tokenizer in {tokenizer_dir} disagrees with the family: {'; '.join(wrong)}")

    def tid(t: str | None) -> int | None:
        return None if t is None else tok.convert_tokens_to_ids(t)

    eos_ids = [tid(t) for t in eos_tokens]
    n_heads, n_kv = tiny.attention_layout(hidden, heads)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=n_heads, num_key_value_heads=n_kv,
        max_position_embeddings=tiny.CONTEXT, tie_word_embeddings=tie_embeddings,
        bos_token_id=tid(bos), eos_token_id=eos_ids, pad_token_id=tid(pad),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=tid(pad), bos_token_id=tid(bos), do_sample=True,
    )
    model.save_pretrained(out, safe_serialization=True)
    marker = {"config_hash": chash, "eos_tokens": list(eos_tokens), "special_tokens": specials, "extra_tokens": extra,
              "bos": bos, "eos": eos, "pad": pad, "add_bos": add_bos, "seed": seed, "layers": layers, "hidden": hidden,
              "heads": heads, "tie_embeddings": tie_embeddings, "vocab_size": len(tok),
              "tokenizer": {**_real_files_sha256(tokenizer_dir), "renames": {str(k): v for k, v in renames.items()}}}
    (out / MARKER).write_text(json.dumps(marker, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _write(out: Path, *, chat_template: str, specials: list[str], extra: list[str], eos_tokens: Sequence[str],
           eos: str, bos: str | None, pad: str | None, add_bos: bool, seed: int, layers: int, hidden: int,
           chash: str, heads: int = tiny.DEFAULT_HEADS, tie_embeddings: bool = tiny.DEFAULT_TIE) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = _family_tokenizer(seed, specials, extra, bos, add_bos)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=bos, eos_token=eos, pad_token=pad,
        model_max_length=tiny.CONTEXT, clean_up_tokenization_spaces=False,
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
        max_position_embeddings=tiny.CONTEXT, tie_word_embeddings=tie_embeddings,
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
                       tie_embeddings: bool = tiny.DEFAULT_TIE, tokenizer_dir: str | Path | None = None,
                       token_renames: Mapping[int, str] | None = None) -> Path:
    """Build a tiny model of one family into `out_dir` and return it as a Path.

    `special_tokens` become special added tokens, `extra_tokens` non-special ones; `bos_token`,
    `pad_token` and the `eos_tokens` are added as special tokens when neither list has them.
    `eos_tokens` are the ids written to generation_config.json / config.json `eos_token_id` (a
    list, in this order); `eos_token` is the tokenizer's eos (tokenizer_config.json), by default
    `eos_tokens[0]`. `chat_template` is saved as chat_template.jinja. `add_bos`: the tokenizer
    prepends `bos_token` when asked to add special tokens. `heads` / `tie_embeddings`: as in
    `rowgrove.model.tiny.build_tiny_model` (`**tiny.servable_kwargs()` gives a folder vLLM's CPU
    engine can serve).

    `tokenizer_dir`: a folder holding a model's real `tokenizer.json` and `tokenizer_config.json`;
    they are kept (the family's template replaces the config's), the embeddings are sized to
    that vocabulary, and the family's tokens and bos / eos / pad are checked against it
    (InputError naming what disagrees); `add_bos` is what the real tokenizer does. `token_renames` {id: token}: added tokens written
    under the family's name for them (see the module docstring).

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
                               heads=heads, tie_embeddings=tie_embeddings, tokenizer_dir=tokenizer_dir,
                               token_renames=token_renames)
    out = Path(out_dir)
    if tokenizer_dir is not None:
        real, renames = Path(tokenizer_dir), dict(token_renames or {})
        return tiny._build_cached(out, chash, lambda tmp: _write_real(
            tmp, real, renames, chat_template=chat_template, specials=specials, extra=extra,
            eos_tokens=list(eos_tokens), eos=eos, bos=bos_token, pad=pad_token, add_bos=add_bos, seed=seed,
            layers=layers, hidden=hidden, chash=chash, heads=heads, tie_embeddings=tie_embeddings),
            complete_hash=_complete_hash, kind="family-model")
    if token_renames:
        raise InputError("token_renames applies to a real tokenizer: pass tokenizer_dir too")
    return tiny._build_cached(out, chash, lambda tmp: _write(
        tmp, chat_template=chat_template, specials=specials, extra=extra, eos_tokens=list(eos_tokens), eos=eos,
        bos=bos_token, pad=pad_token, add_bos=add_bos, seed=seed, layers=layers, hidden=hidden, chash=chash,
        heads=heads, tie_embeddings=tie_embeddings),
        complete_hash=_complete_hash, kind="family-model")
