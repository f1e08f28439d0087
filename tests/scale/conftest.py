"""One local Ray (num_cpus=2) for every test here: it takes seconds and about 1 GB to start."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def local_ray():
    import rowgrove

    ray = pytest.importorskip("ray", reason="the `ray` extra is not installed")

    src = str(Path(rowgrove.__file__).resolve().parents[1])  # workers import rowgrove from here too
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
