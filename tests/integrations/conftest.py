"""Trainer-integration tests: one torch thread; verl runs in its own environment (.venv-stack-verl)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread():
    import torch

    torch.set_num_threads(1)
