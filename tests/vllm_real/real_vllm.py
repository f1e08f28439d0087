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
        self.sent.append(body)
        return body
