"""The `--group` / `--exclude-group` filter that `rowgrove ls` and `rowgrove rows` share."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase


def add_group_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--group", action="append", metavar="GLOB",
                   help="only rollouts whose group id matches this glob (repeatable: any of them), e.g. 's*'")
    p.add_argument("--exclude-group", action="append", metavar="GLOB",
                   help="leave out rollouts whose group id matches this glob (repeatable), e.g. 'eval-*'")


def group_filter(include: Sequence[str] | None, exclude: Sequence[str] | None) -> Callable[[str | None], bool]:
    """A predicate on a group id: true when it matches one of `include` (every id, when none is
    given) and none of `exclude`. Globs are fnmatch patterns, case-sensitive; a rollout without a
    group id matches only the pattern "" (so `--exclude-group ''` leaves those out)."""
    inc, exc = list(include or []), list(exclude or [])

    def keep(group_id: str | None) -> bool:
        g = group_id or ""
        return (not inc or any(fnmatchcase(g, p) for p in inc)) and not any(fnmatchcase(g, p) for p in exc)

    return keep
