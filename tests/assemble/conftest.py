"""Fixtures for the reassembly tests (helpers live in assemble_standin.py)."""

from __future__ import annotations

import pytest

from rowgrove.ledger import Ledger


@pytest.fixture
def ledger(tmp_path):
    lg = Ledger(tmp_path / "ledger.db")
    yield lg
    lg.close()
