"""The environments by name: `make_env(name, seed)` and `make_tasks(name, n, seed)`. A module of
its own so that `envs.synth` (which plays named environments) and the package's `__init__` (which
re-exports both) import it without importing each other.
"""

from __future__ import annotations

from rowgrove.envs.base import Env, Task
from rowgrove.envs.counter import CounterEnv, make_counter_tasks
from rowgrove.envs.lookup import LookupEnv, make_lookup_tasks
from rowgrove.envs.shapes import ShapesEnv, make_shapes_tasks
from rowgrove.errors import InputError

ENV_NAMES = ("counter", "lookup", "shapes")


def make_env(name: str, seed: int = 0) -> Env:
    """A fresh environment called `name`. The environments are deterministic; `seed` is accepted
    so that stochastic environments can share the signature."""
    del seed
    if name == "counter":
        return CounterEnv()
    elif name == "lookup":
        return LookupEnv()
    elif name == "shapes":
        return ShapesEnv()
    raise InputError(f"unknown environment {name!r}: use one of {', '.join(ENV_NAMES)}")


def make_tasks(name: str, n: int, seed: int = 0) -> list[Task]:
    """`n` tasks of environment `name`, deterministic in `seed`."""
    if n < 0:
        raise InputError(f"number of tasks must be >= 0, got {n}")
    if name == "counter":
        return make_counter_tasks(n, seed)
    elif name == "lookup":
        return make_lookup_tasks(n, seed)
    elif name == "shapes":
        return make_shapes_tasks(n, seed)
    raise InputError(f"unknown environment {name!r}: use one of {', '.join(ENV_NAMES)}")
