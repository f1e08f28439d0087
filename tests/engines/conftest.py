from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """Two torch thread pools on 2 cores slow everything ~50x (FACTS.md)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
