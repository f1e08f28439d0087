"""The tiny chat model, built offline in seconds: a byte-level BPE tokenizer trained on the spot
on generated chat / tool-call / JSON / digit / English text, wrapped as a `transformers` fast
tokenizer with ChatML, Llama-3 and tool-call tokens, plus a random-init Llama-architecture causal
LM (2 layers x 64 hidden by default), saved as a normal HF model directory.

Why Llama architecture with `tokenizer_class: PreTrainedTokenizerFast`: transformers 5's
`AutoTokenizer` turns a `model_type=qwen2` checkpoint into `Qwen2Tokenizer`, which replaces the
trained normalizer and pre-tokenizer so ids differ from tokenizer.json (FACTS.md). Declaring the
generic fast class loads tokenizer.json as trained; `tests/model` checks the three loaders agree.

Builds are deterministic (same config -> byte-identical files) and cached: a directory holding a
complete build with the same config hash (`rowgrove-tiny.json`, written last) is reused.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rowgrove.errors import InputError
from rowgrove.model.templates import get_template

BUILDER_VERSION = 2  # 2: 131,072 positions (real coding-agent prompts are 16k-45k tokens)
CONTEXT = 131_072  # positions every tiny model allows; RoPE has no learned table, so the weights are unchanged
MARKER = "rowgrove-tiny.json"

SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
PAD_TOKEN = "<|endoftext|>"

_WORDS = (
    "the a an of to and in is it you that he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use each which she do how "
    "their if will up other about out many then them these so some her would make like him into time "
    "has look two more write go see number no way could people my than first water been call who "
    "oil its now find long down day did get come made may part weather city temperature search "
    "file read list result error value name arguments function tool assistant user system hello "
    "answer question please thanks sure here calculate add sum total price order reply done ok yes"
).split()
_NAMES = ("get_weather", "search", "read_file", "calculator", "add", "lookup", "write_file", "run")
_KEYS = ("city", "query", "path", "a", "b", "x", "unit", "limit", "expression", "text")


# The attention layout and embedding tying of the default build: 4 heads (2 key/value heads) and
# tied embeddings. At the default hidden size 64 that is head_dim 16, which vLLM's CPU attention
# refuses (it takes head_dim 32..512): `servable_kwargs()` gives a build vLLM can serve.
DEFAULT_HEADS = 4
DEFAULT_TIE = True


def config_hash(*, template: str, seed: int, layers: int, hidden: int, vocab_size: int,
                extra_corpus: Sequence[str], heads: int = DEFAULT_HEADS, tie_embeddings: bool = DEFAULT_TIE) -> str:
    """A short hash naming one tiny-model configuration (and the builder version). `heads` and
    `tie_embeddings` enter the hash only when they differ from the defaults, so the folders of
    default builds keep their names."""
    cfg: dict[str, object] = {"builder": BUILDER_VERSION, "template": template, "seed": seed, "layers": layers,
                              "hidden": hidden, "vocab_size": vocab_size, "extra_corpus": list(extra_corpus)}
    if heads != DEFAULT_HEADS:
        cfg["heads"] = heads
    if tie_embeddings != DEFAULT_TIE:
        cfg["tie_embeddings"] = tie_embeddings
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def _corpus(seed: int, extra: Sequence[str]) -> Iterator[str]:
    """Generated training text: chat renderings with tool calls, JSON, digits, English words."""
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))).capitalize() + rng.choice(".?!")

    def args() -> dict[str, object]:
        return {k: rng.choice([rng.randint(-999, 99999), sentence(), rng.random() * 100, True, None])
                for k in rng.sample(_KEYS, rng.randint(1, 3))}

    for _ in range(600):
        name = rng.choice(_NAMES)
        call = json.dumps({"name": name, "arguments": args()}, ensure_ascii=False)
        yield f"<|im_start|>user\n{sentence()}<|im_end|>\n<|im_start|>assistant\n{sentence()}<|im_end|>\n"
        yield f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
        yield f"<|im_start|>user\n<tool_response>\n{json.dumps(args())}\n</tool_response><|im_end|>\n"
        yield f"<|start_header_id|>assistant<|end_header_id|>\n\n<think>\n{sentence()}\n</think>\n\n{sentence()}<|eot_id|>"
        yield f"reply {rng.randint(1, 200)} " + " ".join(str(rng.randint(0, 10**rng.randint(1, 8))) for _ in range(4))
    yield from extra


def _train_tokenizer(seed: int, vocab_size: int, extra: Sequence[str]):  # -> tokenizers.Tokenizer
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(seed, extra), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return tok


def attention_layout(hidden: int, heads: int) -> tuple[int, int]:
    """(attention heads, key/value heads) for `heads` query heads at `hidden`: half as many
    key/value heads (grouped-query attention, as the real families have), at least one.
    InputError when `hidden` does not split into `heads` heads of an even size."""
    if heads < 1 or hidden % heads or (hidden // heads) % 2:
        raise InputError(f"hidden={hidden} does not split into heads={heads} heads of an even size: pick heads "
                         "dividing hidden (vLLM's CPU attention also needs hidden/heads between 32 and 512)")
    return heads, max(1, heads // 2)


def servable_kwargs(hidden: int = 64) -> dict[str, int]:
    """Build arguments that make a tiny model vLLM's CPU engine can serve: head_dim 32 (its CPU
    attention takes head_dim 32..512 and kills the engine on the first request otherwise)."""
    return {"hidden": hidden, "heads": max(1, hidden // 32)}


def _write(out: Path, *, template: str, seed: int, layers: int, hidden: int, vocab_size: int,
           extra_corpus: Sequence[str], chash: str, heads: int = DEFAULT_HEADS,
           tie_embeddings: bool = DEFAULT_TIE) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = get_template(template)
    raw = _train_tokenizer(seed, vocab_size, extra_corpus)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token=spec.end_of_turn, pad_token=PAD_TOKEN, bos_token=spec.bos,
        model_max_length=CONTEXT, clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = spec.jinja
    tokenizer.save_pretrained(out)

    eot = raw.token_to_id(spec.end_of_turn)
    n_heads, n_kv = attention_layout(hidden, heads)
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=n_heads, num_key_value_heads=n_kv,
        max_position_embeddings=CONTEXT, tie_word_embeddings=tie_embeddings,
        bos_token_id=raw.token_to_id(spec.bos) if spec.bos else None, eos_token_id=eot,
        pad_token_id=raw.token_to_id(PAD_TOKEN),
    )
    config.tokenizer_class = "PreTrainedTokenizerFast"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eot, pad_token_id=raw.token_to_id(PAD_TOKEN),
        bos_token_id=config.bos_token_id, do_sample=True,
    )
    model.save_pretrained(out, safe_serialization=True)
    # tokenizer_config.json: make AutoTokenizer load the generic fast class, never a model's own.
    cfg_path = out / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text())
    tcfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(tcfg, indent=2, sort_keys=True) + "\n")
    marker: dict[str, object] = {"config_hash": chash, "template": template, "seed": seed, "layers": layers,
                                 "hidden": hidden, "vocab_size": vocab_size}
    if heads != DEFAULT_HEADS or tie_embeddings != DEFAULT_TIE:
        marker.update(heads=heads, tie_embeddings=tie_embeddings)
    (out / MARKER).write_text(json.dumps(marker, sort_keys=True) + "\n")


def _complete_hash(path: Path) -> str | None:
    try:
        return json.loads((path / MARKER).read_text())["config_hash"]
    except (OSError, ValueError, KeyError):
        return None


def _build_cached(out: Path, chash: str, write: Callable[[Path], None], *,
                  complete_hash: Callable[[Path], str | None] = _complete_hash, kind: str = "tiny-model") -> Path:
    """Make `out` hold the complete build whose config hash is `chash` and return `out`.

    Promises: when `complete_hash(out) == chash` already, `out` is returned untouched and `write`
    is not called. A non-empty `out` that is not a build (`complete_hash` is None) is refused with
    InputError ("... is not a {kind} build ..."). Otherwise `write(tmp)` builds into a fresh
    sibling temp dir, which then replaces `out` (another build there is removed) by one rename;
    when a concurrent builder completes the same build first, its result is kept. The temp dir
    never survives the call.
    """
    if complete_hash(out) == chash:
        return out
    if out.exists() and any(out.iterdir()) and complete_hash(out) is None:
        raise InputError(f"{out} exists and is not a {kind} build: pass an empty or new directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        if out.exists():
            if complete_hash(out) == chash:  # another builder finished first
                return out
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if complete_hash(out) != chash:
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def build_tiny_model(out_dir: str | Path, *, template: str = "chatml", seed: int = 0, layers: int = 2,
                     hidden: int = 64, vocab_size: int = 1024, extra_corpus: Sequence[str] = (),
                     heads: int = DEFAULT_HEADS, tie_embeddings: bool = DEFAULT_TIE) -> Path:
    """Build the tiny model into `out_dir` and return it as a Path.

    `vocab_size` is the BPE vocabulary including the 7 special tokens; the 6 tool/think tokens are
    added on top (1030 ids by default). `extra_corpus` adds tokenizer training text. `heads`: the
    attention heads (key/value heads: half of them, at least one); `tie_embeddings`: whether the
    output layer shares the input embedding (`tie_word_embeddings`, as Qwen3-0.6B and Llama 3.2 1B
    have it) or has its own `lm_head.weight`. The default (hidden 64, 4 heads: head_dim 16) is
    what the tests' literal values were recorded on; vLLM's CPU engine needs head_dim >= 32, so
    a model to serve with real vLLM is built with `**servable_kwargs()` (hidden 64, 2 heads).

    Deterministic: the same arguments give byte-identical files. Cached: when `out_dir` already
    holds a complete build of the same configuration it is returned untouched. A directory holding
    another tiny build is replaced; a non-empty directory that is not a tiny build is refused.
    Safe against concurrent builders: the build happens in a sibling temp dir and is renamed in.
    """
    if template not in ("chatml", "qwen3", "llama3"):
        get_template(template)  # raises InputError naming the known templates
    if hidden % 4 or hidden < 8 or layers < 1:
        raise InputError(f"tiny model needs hidden a multiple of 4 (>= 8) and layers >= 1, got hidden={hidden}, layers={layers}")
    attention_layout(hidden, heads)
    out = Path(out_dir)
    chash = config_hash(template=template, seed=seed, layers=layers, hidden=hidden, vocab_size=vocab_size,
                        extra_corpus=extra_corpus, heads=heads, tie_embeddings=tie_embeddings)
    return _build_cached(out, chash, lambda tmp: _write(tmp, template=template, seed=seed, layers=layers,
                                                        hidden=hidden, vocab_size=vocab_size,
                                                        extra_corpus=extra_corpus, chash=chash, heads=heads,
                                                        tie_embeddings=tie_embeddings))


def ending_model_dir(src: str | Path, p_end: float = 0.25) -> Path:
    """A copy of the tiny model folder `src` that ends its turns like a trained model, for tests and
    benchmarks against real servers (which sample; a random model almost never samples its stop
    token, so its conversations would never continue).

    `p_end > 0`: the output row of the end-of-turn token points along the mean final hidden state,
    scaled so that the token is sampled with probability about `p_end` per step (turns end with
    finish "stop" within a few tokens). `p_end = 0`: no stop or special id is ever sampled, so a
    request runs until its max_tokens or its client leaves. Built once next to `src` (renamed into
    place, so a reader never sees half a folder) and reused."""
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from rowgrove.model.turns import end_of_turn_id, stop_token_ids
    from rowgrove.model.turns import folder_tokenizer as load_tokenizer

    src = Path(src)
    out = src.with_name(src.name + f"-ending{int(p_end * 100)}v2")
    if (out / "rowgrove-ending.json").is_file():
        return out
    tok = load_tokenizer(str(src))
    eot = end_of_turn_id(tok)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        ids = torch.randint(0, len(tok), (8, 48), generator=g)
        h = model.model(input_ids=ids).last_hidden_state.reshape(-1, model.config.hidden_size)
        u = h.mean(0) / h.mean(0).norm()
        head = model.lm_head.weight  # (tied: the input embedding too)
        if p_end <= 0:  # never end: every stop id's row points away from the hidden states
            # residual dimension 0 of every input embedding is 1 (the init's values are ~0.02), so
            # the final hidden state's dimension 0 is about +8 at every position; the output rows
            # read it with +1, the stop ids' rows with -1: a stop id trails every other token by
            # ~16 logits. (Tied: the input embedding is the output layer, one tensor.)
            emb = model.get_input_embeddings().weight
            emb[:, 0] = 1.0
            head[:, 0] = 1.0
            for sid in set(stop_token_ids(tok, src)) | set(tok.all_special_ids):
                head[sid, 0] = -1.0
        else:
            # p(eot) at scale s is sigmoid(s * h.u - logsumexp of the other logits): the other
            # logits are computed once (a real vocabulary's output layer is 100k+ rows), then the
            # scale is bisected on the one column that changes
            logits = h @ head.T
            logits[:, eot] = float("-inf")
            rest, along = torch.logsumexp(logits, -1), h @ u
            lo, hi = 0.0, 200.0
            for _ in range(40):
                p = torch.sigmoid((lo + hi) / 2 * along - rest).mean().item()
                lo, hi = ((lo + hi) / 2, hi) if p < p_end else (lo, (lo + hi) / 2)
            head[eot] = (lo + hi) / 2 * u
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent)) / "m"
    shutil.copytree(src, tmp)
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "rowgrove-ending.json").write_text(json.dumps({"from": str(src), "p_end": p_end}) + "\n")
    try:
        tmp.rename(out)
    except OSError:  # another builder finished first
        if not (out / "rowgrove-ending.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp.parent, ignore_errors=True)
    return out


def cache_root() -> Path:
    """$ROWGROVE_CACHE, default ~/.cache/rowgrove."""
    return Path(os.environ.get("ROWGROVE_CACHE") or Path.home() / ".cache" / "rowgrove")


def tiny_model_dir(template: str = "chatml", seed: int = 0, **kw) -> Path:
    """The tiny model for this configuration under the cache root, built on first use."""
    kw.setdefault("layers", 2)
    kw.setdefault("hidden", 64)
    kw.setdefault("vocab_size", 1024)
    kw["extra_corpus"] = tuple(kw.get("extra_corpus", ()))
    chash = config_hash(template=template, seed=seed, **kw)
    return build_tiny_model(cache_root() / f"tiny-{chash}", template=template, seed=seed, **kw)
