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
    """A copy of the untied model `src` whose output row for the end-of-turn token points along
    the mean final hidden state, scaled so that the token is sampled with probability about
    `p_end` per step: a random model then ends its turns (finish "stop") within a few tokens, as
    a trained one does, so conversations continue. `p_end=0`: the stop ids are never sampled, so
    a request runs until its max_tokens or its client leaves (see the comment below). Built once
    next to `src`."""
    import json
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from rowgrove.model.load import end_of_turn_id, load_tokenizer, stop_token_ids

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
            lo, hi = 0.0, 200.0
            for _ in range(40):
                head[eot] = (lo + hi) / 2 * u
                p = torch.softmax(h @ head.T, -1)[:, eot].mean().item()
                lo, hi = ((lo + hi) / 2, hi) if p < p_end else (lo, (lo + hi) / 2)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "rowgrove-ending.json").write_text(json.dumps({"from": str(src), "p_end": p_end}) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


class RecordingVLLMEngine(VLLMEngine):
    """The vllm engine, keeping every /v1/completions body it sent (to show what vLLM was given)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent: list[dict] = []

    def request_body(self, prompt, sampling):
        body = super().request_body(prompt, sampling)
        self.sent.append(body)
        return body
