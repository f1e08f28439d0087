"""pyproject.toml declares ranges, locks/ holds the exact versions `make` installs (scripts/env_lib.sh):
the two must agree, and every range must have the lower end the lowest-versions job installs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# each lock, with the extras its environment installs (scripts/install_*_env.sh)
LOCKS = {"main": ["dev", "frameworks", "ray", "trl"], "vllm": ["dev"], "verl": ["verl", "dev"], "lowest": ["dev"]}


def _lock(name: str) -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "locks" / f"{name}.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            pkg, _, version = line.partition("==")
            pins[canonicalize_name(pkg)] = Version(version)
    return pins


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_lock_satisfies_the_ranges_of_what_its_environment_installs(name):
    pins = _lock(name)
    reqs = [*PROJECT["dependencies"], *(r for extra in LOCKS[name] for r in PROJECT["optional-dependencies"][extra])]
    wrong = []
    for text in reqs:
        req = Requirement(text)
        have = pins.get(canonicalize_name(req.name))
        if have is None:
            wrong.append(f"{req.name} is not in locks/{name}.txt")
        elif not req.specifier.contains(have, prereleases=True):
            wrong.append(f"{req.name} {have} is outside {req.specifier}")
    assert not wrong, f"locks/{name}.txt disagrees with pyproject.toml (make lock rewrites it): " + "; ".join(wrong)


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_every_lock_installs_the_cpu_torch(name):
    assert str(_lock(name)["torch"]) == "2.13.0+cpu"


def test_every_core_and_dev_range_has_a_lower_end_and_the_lowest_lock_is_at_it():
    lowest = _lock("lowest")
    for text in [*PROJECT["dependencies"], *PROJECT["optional-dependencies"]["dev"]]:
        low = re.search(r">=\s*([^,;\s]+)", text)
        assert low is not None, f"{text!r} has no lower end (>=): the lowest-versions job installs it"
        name, floor = canonicalize_name(Requirement(text).name), Version(low.group(1)).release
        # "2.13" is 2.13.0: compare the release numbers the lower end names
        assert lowest[name].release[: len(floor)] == floor and not any(lowest[name].release[len(floor):]), (
            f"locks/lowest.txt has {name} {lowest[name]}, the range's lower end is {low.group(1)}")
