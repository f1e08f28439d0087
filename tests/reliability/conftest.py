"""The reliability suite (issue 10): hostile and fuzzed input, engine faults, cut streams, kill -9
and SIGTERM under load, and the CLI tried as a careless user would. Loopback only, bounded: the
subprocess tests are marked `slow` (still run by `make test`).

Shares the gateway tests' HTTP helpers (`fixtures_http`: the fault-injecting `TestEngine`,
`scripted_engine`, `dump_ledger`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gateway"))
