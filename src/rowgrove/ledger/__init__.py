"""The embedded ledger: every rollout and every call that reached the engine, in one SQLite file."""

from rowgrove.ledger.schema import SCHEMA
from rowgrove.ledger.store import Ledger

__all__ = ["SCHEMA", "Ledger"]
