"""Rows from several ledgers at once: one gateway per ledger, one set of rows for the step.

With several gateways (`rowgrove.scale`, or several `rowgrove serve` processes), each gateway
writes its own ledger and a rollout lives on one gateway. A step's rows are the union of the
ledgers' finished rollouts; group baselines are computed over that union afterwards
(`assign_advantages`), so the rollouts of one group may sit on different gateways.

Rollout ids are random per gateway and meant to be unique across them; the same id in two
ledgers means the same ledger was given twice or two gateways shared a file, and it is refused,
naming the id and both ledgers, rather than merged into one rollout with two sets of calls.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rowgrove.assemble.build import build_rows
from rowgrove.assemble.read import iter_finished
from rowgrove.errors import InputError
from rowgrove.ledger import Ledger
from rowgrove.types import Row


@dataclass
class LedgerRows:
    """What the finished rollouts of several ledgers became: `rows` (ledger order, then creation
    order), `rollouts` (finished rollouts read), `open_ids` (open rollouts skipped, every ledger),
    `reason_kinds` (why invalid rollouts are invalid, counted)."""

    rows: list[Row] = field(default_factory=list)
    rollouts: int = 0
    open_ids: list[str] = field(default_factory=list)
    reason_kinds: Counter[str] = field(default_factory=Counter)


def check_unique_rollouts(ids_by_source: Iterable[tuple[str, Iterable[str]]]) -> None:
    """Raise InputError if one rollout id appears under two sources (ledger paths, gateway names);
    the message names the first such id and both sources."""
    seen: dict[str, str] = {}
    for source, ids in ids_by_source:
        for rid in ids:
            first = seen.setdefault(rid, source)
            if first != source:
                raise InputError(
                    f"rollout {rid} is in both {first} and {source}: rollout ids must be unique across "
                    "gateways; pass each ledger once, and give every gateway its own ledger file")


def rows_from_ledgers(paths: Sequence[str | Path], *,
                      progress: Callable[[Iterable], Iterable] | None = None,
                      keep: Callable[[str | None], bool] | None = None) -> LedgerRows:
    """Rows of every finished rollout of every ledger in `paths` (advantages not yet assigned).

    A ledger given twice is an InputError. Every ledger is checked (ids listed, open ones included) before any row is built, so a
    duplicate rollout id fails fast. `progress` wraps the iteration over finished rollouts (a
    tqdm bar). `keep(group_id)`: only the finished rollouts of the groups it accepts are built."""
    out = LedgerRows()
    resolved = [Path(p).resolve() for p in paths]
    twice = [str(p) for k, p in enumerate(paths) if resolved[k] in resolved[:k]]
    if twice:
        raise InputError(f"ledger {twice[0]} is given twice: its rollouts would be counted twice; pass each ledger once")
    ids: list[tuple[str, list[str]]] = []
    for path in paths:
        with Ledger(path, readonly=True) as ledger:
            ros = ledger.rollouts()
            ids.append((str(path), [ro.id for ro in ros]))
            out.open_ids.extend(ro.id for ro in ros if ro.status == "open")
    check_unique_rollouts(ids)

    def finished() -> Iterable:
        for path in paths:
            yield from iter_finished(path)

    for rollout, calls in (progress or (lambda it: it))(finished()):
        if keep is not None and not keep(rollout.group_id):
            continue
        built = build_rows(rollout, calls)
        out.rollouts += 1
        out.rows.extend(built.rows)
        out.reason_kinds.update(built.reason_kinds)
    return out
