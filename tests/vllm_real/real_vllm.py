"""Helpers of the real-vLLM suite (see conftest.py): where vLLM's environment is, the tiny models
it serves, and an engine that records what it sent."""

from __future__ import annotations

from pathlib import Path

from rowgrove.engines.launch import default_vllm_python
from rowgrove.engines.vllm import VLLMEngine


def vllm_python() -> Path | None:
    """The python of the vLLM environment, or None when there is none."""
    py = default_vllm_python()
    return py if py is not None and py.is_file() else None


def ending_model(src: Path, p_end: float = 0.25) -> Path:
    """rowgrove.model.tiny.ending_model_dir (see there)."""
    from rowgrove.model.tiny import ending_model_dir

    return ending_model_dir(src, p_end)


class RecordingVLLMEngine(VLLMEngine):
    """The vllm engine, keeping every /v1/completions body it sent (to show what vLLM was given)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent: list[dict] = []

    def request_body(self, prompt, sampling):
        body = super().request_body(prompt, sampling)
        # a copy: the engine then swaps the body's prompt for a pre-encoded orjson.Fragment; a
        # continuation's prompt is an ExtendedIds (its parts), recorded as the list it reads as
        self.sent.append({**body, "prompt": list(body["prompt"])})
        return body


O200K_FILE = "o200k_base.tiktoken"
# tiktoken's (and openai_harmony's) pinned sha256 of o200k_base.tiktoken
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the printable character each byte is written as in a
    byte-level BPE tokenizer.json, back to the byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def write_o200k(tokenizer_json: Path, out_dir: Path) -> Path:
    """Write `o200k_base.tiktoken` into `out_dir` from gpt-oss's tokenizer.json, offline: tiktoken's
    format, one `base64(token bytes) rank` line per BPE entry in rank order. openai_harmony reads it
    from $TIKTOKEN_ENCODINGS_BASE instead of downloading it. Its sha256 is checked against the one
    tiktoken pins for o200k_base (ValueError otherwise: then the vocabulary is not o200k)."""
    import base64
    import hashlib
    import json

    vocab = json.loads(tokenizer_json.read_text(encoding="utf-8"))["model"]["vocab"]
    dec = _byte_decoder()
    data = "".join(base64.b64encode(bytes(dec[ch] for ch in tok)).decode() + f" {rank}\n"
                   for tok, rank in sorted(vocab.items(), key=lambda kv: kv[1])).encode()
    digest = hashlib.sha256(data).hexdigest()
    if digest != O200K_SHA256:
        raise ValueError(f"{tokenizer_json} does not give o200k_base (sha256 {digest}, tiktoken pins {O200K_SHA256})")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / O200K_FILE).write_bytes(data)
    return out_dir
