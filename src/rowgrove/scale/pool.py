"""GatewayPool: N gateway actors on Ray, harness episodes placed on them as Ray tasks.

Placement: each job goes to the live gateway with the fewest episodes in flight (ties: the
lowest slot) at the moment it is submitted, and keeps that gateway for its whole lifetime (the
task is given one base URL). Backpressure: at most `max_in_flight` episode tasks exist at once;
the next job is submitted only when one finishes (`ray.wait`), so a step of ten thousand jobs
holds ten thousand small job descriptions, not ten thousand running tasks.

Failure: an outcome that comes back masked makes the pool ping its gateway; a gateway actor that
does not answer (`RayActorError`) is dead: every outcome of that actor generation that is not
finished with rows is masked `gateway_died: ...`, and a new actor with a fresh ledger takes the
slot (with the newest weights, when the pool has synced any). Finished rollouts keep their rows:
tasks read them from the gateway as soon as the rollout is finished.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rowgrove.assemble.ledgers import check_unique_rollouts
from rowgrove.errors import InputError, RowgroveError
from rowgrove.scale.episodes import EpisodeJob, EpisodeOutcome, run_episode
from rowgrove.types import Row


def require_ray() -> Any:
    """The `ray` module, or an InputError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("Ray is not installed: pip install 'rowgrove[ray]' (or pip install ray==2.60.0)") from None
    return ray


@dataclass
class StepRollouts:
    """A step's rollouts from every gateway: `outcomes` in job order, `rows` of the unmasked
    ones (advantages not yet assigned: call `assign_advantages(rows)`, whose baselines then span
    gateways), `masked` the masked outcomes, `replaced` the slots whose actor was replaced."""

    outcomes: list[EpisodeOutcome]
    rows: list[Row]
    masked: list[EpisodeOutcome] = field(default_factory=list)
    replaced: list[int] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class _Slot:
    actor: Any
    generation: int
    url: str
    node_id: str | None
    ledger: str
    in_flight: int = 0
    alive: bool = True


class GatewayPool:
    """`n` gateways as Ray actors, each with its own ledger under `ledger_dir`.

    `model`, `engine`, `engine_options`: what each gateway serves (see GatewayServer);
    `engine_options` may be a list, one dict per gateway (each its own servers' URLs).
    `max_in_flight`: episode tasks at once, over all gateways (default 8 per gateway).
    `episode_cpus` / `gateway_cpus`: Ray CPU resources per episode task / gateway actor;
    `gateway_resources`: custom Ray resources each gateway actor needs (start the inference
    nodes with `ray start --resources '{"rowgrove_gateway": 1}'` and pass {"rowgrove_gateway": 1}
    to put one gateway on each, next to its servers).
    Call `close()` (or use `with`) to stop the actors."""

    def __init__(self, n: int, *, ledger_dir: str | Path, model: str = "tiny", engine: str = "scripted",
                 engine_options: dict[str, Any] | list[dict[str, Any]] | None = None, max_in_flight: int | None = None,
                 episode_cpus: float = 0.25, gateway_cpus: float = 0.5, gateway_resources: dict[str, float] | None = None,
                 threads: int | None = 1,
                 settings: dict[str, Any] | None = None):
        ray = require_ray()
        if n < 1:
            raise InputError(f"a gateway pool needs at least 1 gateway, got {n}")
        if not ray.is_initialized():
            raise RowgroveError("Ray is not initialized: call ray.init() (or ray.init(address=...)) first")
        from rowgrove.scale.gateway_actor import GatewayServer

        self._ray = ray
        self._actor_cls = ray.remote(num_cpus=gateway_cpus, resources=gateway_resources or {}, max_restarts=0)(GatewayServer)
        self._task = ray.remote(num_cpus=episode_cpus, max_retries=0)(run_episode)
        if isinstance(engine_options, list) and len(engine_options) != n:
            raise InputError(f"engine_options lists {len(engine_options)} gateways' options for {n} gateways")
        self._spec = dict(model=model, engine=engine, engine_options=engine_options, threads=threads,
                          settings=settings)
        self.ledger_dir = Path(ledger_dir)
        self.max_in_flight = max_in_flight or 8 * n
        if self.max_in_flight < 1:
            raise InputError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        self._weights: Any = None  # object ref of the newest state dict, for replacements
        self.slots: list[_Slot] = []
        actors = [self._start(k, 0) for k in range(n)]
        infos = ray.get([a.info.remote() for a, _ in actors])
        self.slots = [_Slot(a, 0, i["url"], i["node_id"], ledger) for (a, ledger), i in zip(actors, infos, strict=True)]

    # ---- actors -----------------------------------------------------------------------------

    def _start(self, slot: int, generation: int) -> tuple[Any, str]:
        ledger = str(self.ledger_dir / f"gateway-{slot}.{generation}.sqlite")
        options = self._spec["engine_options"]
        return self._actor_cls.remote(self._spec["model"], self._spec["engine"], ledger,
                                      engine_options=options[slot] if isinstance(options, list) else options, threads=self._spec["threads"],
                                      settings=self._spec["settings"]), ledger

    def _replace(self, k: int) -> None:
        old = self.slots[k]
        actor, ledger = self._start(k, old.generation + 1)
        info = self._ray.get(actor.info.remote())
        if self._weights is not None:
            self._ray.get(actor.update_weights.remote(self._weights))
        self.slots[k] = _Slot(actor, old.generation + 1, info["url"], info["node_id"], ledger)

    def _alive(self, k: int, timeout: float = 10.0) -> bool:
        ray = self._ray
        try:
            ray.get(self.slots[k].actor.ping.remote(), timeout=timeout)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    @property
    def ledgers(self) -> list[str]:
        """Every ledger the pool's gateways wrote, replaced actors' included."""
        return sorted(str(p) for p in self.ledger_dir.glob("gateway-*.sqlite"))

    def kill(self, slot: int) -> None:
        """Kill the actor in `slot` (what a lost node does); for failure tests and drills."""
        self._ray.kill(self.slots[slot].actor, no_restart=True)

    def update_weights(self, state_dict: Any) -> list[int]:
        """Load `state_dict` into every gateway's engine (one object in Ray's store for all);
        returns their weights versions. Replacements started later get it too."""
        self._weights = self._ray.put(state_dict)
        return self._ray.get([s.actor.update_weights.remote(self._weights) for s in self.slots])

    # ---- episodes ---------------------------------------------------------------------------

    def _place(self) -> int:
        live = [k for k, s in enumerate(self.slots) if s.alive]
        return min(live, key=lambda k: (self.slots[k].in_flight, k))

    def _submit(self, job: EpisodeJob) -> tuple[Any, int]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        k = self._place()
        s = self.slots[k]
        s.in_flight += 1
        opts = {}
        if s.node_id is not None:  # the gateway listens on its node's loopback
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(s.node_id, soft=False)
        return self._task.options(**opts).remote(s.url, job, k, s.generation), k

    def run(self, jobs: Sequence[EpisodeJob]) -> StepRollouts:
        """Run every job (at most `max_in_flight` at once) and gather the step's rollouts."""
        ray = self._ray
        keys = [j.key for j in jobs]
        if len(set(keys)) != len(keys):
            raise InputError("episode jobs need distinct keys: each names one outcome of the step")
        t0 = time.perf_counter()
        queue = list(jobs)[::-1]
        pending: dict[Any, tuple[EpisodeJob, int, int]] = {}
        done: dict[str, EpisodeOutcome] = {}
        replaced: list[int] = []
        dead: set[tuple[int, int]] = set()  # (slot, generation) of actors found dead
        while queue or pending:
            while queue and len(pending) < self.max_in_flight:
                job = queue.pop()
                ref, k = self._submit(job)
                pending[ref] = (job, k, self.slots[k].generation)
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                job, k, gen = pending.pop(ref)
                if self.slots[k].generation == gen:  # a replaced actor's tasks no longer count
                    self.slots[k].in_flight -= 1
                try:
                    out = ray.get(ref)
                except ray.exceptions.RayError as e:  # the task's worker itself died
                    out = EpisodeOutcome(key=job.key, group_id=job.group_id, slot=k,
                                         generation=gen, rollout_id=None, reward=None,
                                         mask_reason=f"episode_failed: {type(e).__name__}")
                if out.mask_reason is not None and (out.slot, out.generation) not in dead:
                    s = self.slots[out.slot]
                    if s.generation == out.generation and not self._alive(out.slot):
                        dead.add((out.slot, out.generation))
                        s.alive = False
                        self._replace(out.slot)
                        replaced.append(out.slot)
                if (out.slot, out.generation) in dead and out.mask_reason is not None:
                    out.mask_reason = f"gateway_died: gateway {out.slot} (actor generation {out.generation}) " \
                                      f"was lost before this rollout finished ({out.mask_reason})"
                done[out.key] = out
        outcomes = [done[k] for k in keys]
        by_actor: dict[str, list[str]] = {}
        for o in outcomes:
            if o.rollout_id:
                by_actor.setdefault(f"gateway {o.slot}.{o.generation}", []).append(o.rollout_id)
        check_unique_rollouts(by_actor.items())
        rows = [r for o in outcomes if o.mask_reason is None for r in o.rows]
        return StepRollouts(outcomes=outcomes, rows=rows, masked=[o for o in outcomes if o.mask_reason],
                            replaced=replaced, seconds=time.perf_counter() - t0)

    def close(self) -> None:
        """Stop every gateway actor (their ledgers stay on disk)."""
        ray = self._ray
        for s in self.slots:
            try:
                ray.get(s.actor.close.remote(), timeout=30)
            except ray.exceptions.RayError:
                pass
            ray.kill(s.actor, no_restart=True)
        self.slots = []

    def __enter__(self) -> GatewayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
