"""Trainer tests: one torch thread (engine and trainer share the process)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
