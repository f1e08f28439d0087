"""Where a root prompt's text may be cut into lines and each line tokenized on its own, with the
same ids as tokenizing the whole text.

A byte-level BPE tokenizer first cuts its input into words with a regular expression and then
merges bytes within each word, so two texts tokenize as their concatenation does wherever the
expression would cut between them anyway. For the expressions below that holds after a newline
whose neighbours are both non-whitespace (`a\\nb`): no alternative matches a newline together with
a letter, digit or mark after it, and the newline's own match is the same whether or not text
follows it (`\\s+(?!\\S)` at the end of a piece matches what `\\s+` matches before the `b`; with
whitespace before the newline it would not, hence the left neighbour). So a root whose messages
repeat lines (a file read twice, the same tool output) tokenizes each distinct line once.

Only tokenizers whose pre-tokenization is exactly one of these is cut; any other keeps whole
pieces. `Renderer.encode_prompt` also checks its first cut prompt against tokenizing it whole.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Container, Sequence
from typing import Any

Key = tuple[int | None, str]  # (the added token's id before the text or None, the text)

# the expressions that cut words, as tokenizer.json spells them (Split pre-tokenizer + ByteLevel
# without its own regex): Qwen2/Qwen2.5/Qwen3's, Llama 3's (and tiktoken cl100k's)
_SAFE_SPLITS = frozenset({
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
})
_SAFE_NORMALIZERS = (None, {"type": "NFC"})

# a cut after a newline with non-whitespace on both sides (zero-width, for re.split)
_LINE_CUT = re.compile(r"(?<=\S\n)(?=\S)")


def lines_cut_exactly(backend: Any) -> bool:
    """Whether `backend` (a `tokenizers.Tokenizer`) tokenizes text cut by `split_lines` exactly as
    whole: a byte-level BPE whose words are cut by GPT-2's expression (ByteLevel with its regex)
    or one of `_SAFE_SPLITS`, adding no prefix space, normalising at most by NFC."""
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # noqa: BLE001 - a backend that cannot describe itself is not cut
        return False
    if spec.get("normalizer") not in _SAFE_NORMALIZERS or (spec.get("model") or {}).get("type") != "BPE":
        return False
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel":
        return pre.get("use_regex") is True and pre.get("add_prefix_space") is False
    if pre.get("type") == "Sequence":
        steps = pre.get("pretokenizers") or []
        if len(steps) != 2:
            return False
        split, byte_level = steps
        pattern = (split.get("pattern") or {}).get("Regex")
        return (split.get("type") == "Split" and pattern in _SAFE_SPLITS and split.get("behavior") == "Isolated"
                and split.get("invert") is False and byte_level.get("type") == "ByteLevel"
                and byte_level.get("use_regex") is False and byte_level.get("add_prefix_space") is False)
    return False


def split_lines(text: str) -> list[str]:
    """`text` cut after every newline that has non-whitespace on both sides (a line keeps its
    newline); the parts join back to `text`."""
    return _LINE_CUT.split(text) if "\n" in text else [text]


def units_of(pieces: Sequence[Key], cut: bool, known: Container[Key]) -> dict[Key, list[Key]]:
    """What each new piece is tokenized as: itself; or, with `cut`, its lines that repeat (in
    `known`, or more than once among `pieces`) each alone, and every run of lines between them
    as one text. Many small texts cost the tokenizer more than one large one, so only a line
    that can be reused is cut out. The first line keeps the piece's added token; the others
    have none (they follow a newline, not an added token)."""
    if not cut:
        return {p: [p] for p in pieces}
    lines = {}
    for prev, text in pieces:
        parts = split_lines(text)
        lines[(prev, text)] = [(prev if i == 0 else None, part) for i, part in enumerate(parts)]
    seen = Counter(k for keys in lines.values() for k in keys)
    out: dict[Key, list[Key]] = {}
    for piece, keys in lines.items():
        units: list[Key] = []
        run: list[Key] = []
        for k in keys:
            if seen[k] > 1 or k in known:
                if run:
                    units.append((run[0][0], "".join(t for _, t in run)))
                    run = []
                units.append(k)
            else:
                run.append(k)
        if run:
            units.append((run[0][0], "".join(t for _, t in run)))
        out[piece] = units
    return out

