"""The trainer's rollouts on Ray (`rowgrove train --ray`): a GatewayPool instead of the gateway in
this process, the same jobs, seeds and rows.

    step tasks ──► EpisodeJob per rollout (AgentHarness: the reference agent, the step's seeds)
               ──► GatewayPool.run: least-loaded sticky placement over `gateways` actors
               ──► rows read back from each rollout's gateway; masked rollouts (a lost gateway)
                   have no rows, a NaN reward in the step's results and their reason in
                   `invalid_reason`
    weights    ──► GatewayPool.update_weights after every step (one object in Ray's store)

Each gateway actor holds its own engine: with engine hf a copy of the policy loaded from the
run's start folder (then synced), with vllm / sglang its share of `engine_url` (the URLs dealt
round-robin), so every gateway sits in front of its own inference servers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rowgrove.errors import InputError
from rowgrove.train.jobs import agent_config, mix
from rowgrove.types import Row


class RayRollouts:
    """Rollouts for `train()` on a GatewayPool; `.run`, `.rows`, `.sync`, `.close` mirror what the
    loop does with its in-process gateway."""

    def __init__(self, cfg: Any, start_dir: Path, run_dir: Path):
        from rowgrove.scale import GatewayPool, require_ray

        ray = require_ray()
        if not ray.is_initialized():
            if cfg.ray_address:
                ray.init(address=cfg.ray_address)
            else:
                ray.init(include_dashboard=False)
        if cfg.engine == "hf":
            engines = [{"engine": "hf", "engine_options": {"max_batch": max(1, min(cfg.concurrency, 64))}}]
        else:
            urls = [u.strip() for u in str(cfg.engine_url).split(",") if u.strip()]
            if len(urls) < cfg.gateways:
                raise InputError(f"--gateways {cfg.gateways} needs at least as many engine URLs, got {len(urls)}: "
                                 "each gateway fronts its own servers")
            engines = [{"engine": cfg.engine, "engine_options": {
                "url": ",".join(urls[k::cfg.gateways]), "sync_dir": str(run_dir / f"weights-g{k}")}}
                for k in range(cfg.gateways)]
        options = [e["engine_options"] for e in engines]
        self.pool = GatewayPool(cfg.gateways, ledger_dir=run_dir / "ledgers", model=str(start_dir),
                                engine=engines[0]["engine"], engine_options=options if len(options) > 1 else options[0],
                                max_in_flight=cfg.concurrency, threads=cfg.threads or None)
        self.weights_version = 0

    def run(self, cfg: Any, tasks: list[Any], n: int, tag: str, seed: int) -> list[Any]:
        """The step's episodes (n per task, group `{tag}-p{i}`), as EpisodeResults in job order."""
        from rowgrove.agents.loop import EpisodeResult
        from rowgrove.scale import EpisodeJob
        from rowgrove.scale.episodes import AgentHarness

        agent = agent_config(cfg)
        jobs = []
        for i, task in enumerate(tasks):
            for k in range(n):
                base = mix(seed, i, k)
                harness = AgentHarness(env=cfg.env, env_seed=seed, task=task, config=agent,
                                       extra_body=lambda a, att, base=base: {"seed": mix(base, a, att)})
                jobs.append(EpisodeJob(key=f"{tag}-p{i}-{k}", group_id=f"{tag}-p{i}", harness=harness,
                                       metadata={"tag": tag, "task_id": task.task_id}))
        step = self.pool.run(jobs)
        results = []
        for o in step.outcomes:
            info = dict(o.info)
            info.update(rollout_id=o.rollout_id, group_id=o.group_id, gateway=o.slot)
            info["outcome"] = o
            results.append(EpisodeResult(messages=[], reward=math.nan if o.reward is None else o.reward,
                                         actions=int(info.get("actions", 0)), rejected=int(info.get("rejected", 0)),
                                         compactions=int(info.get("compactions", 0)), calls=o.calls,
                                         valid=o.mask_reason is None, info=info))
        return results

    def rows(self, results: list[Any]) -> tuple[list[Row], list[Any]]:
        """Rows of the results' rollouts (ids prefixed by job position, as `collect_rows` does)
        and one RolloutRows per result (a masked one: no rows, the mask reason as invalid_reason)."""
        import dataclasses

        from rowgrove.assemble import RolloutRows

        rows: list[Row] = []
        built = []
        for j, res in enumerate(results):
            o = res.info["outcome"]
            if o.mask_reason:
                kind = o.mask_reason.split(":", 1)[0]  # gateway_died | episode_failed
                built.append(RolloutRows(rows=[], metrics={}, invalid_reason=o.mask_reason,
                                         rollout_id=o.rollout_id or "", reason_kinds=[kind]))
                continue
            built.append(RolloutRows(rows=o.rows, metrics=o.metrics, invalid_reason=o.invalid_reason,
                                     rollout_id=o.rollout_id or ""))
            rows.extend(dataclasses.replace(r, rollout_id=f"{j:06d}:{r.rollout_id}") for r in o.rows)
        return rows, built

    def sync(self, state_dict: dict[str, Any], model: Any = None) -> int:
        """The policy's weights to every gateway's engine; the version they report. `model` is
        not shipped to the actors: a remote engine there checks its servers against a CPU mirror
        of the synced checkpoint (rowgrove.engines.verify.WeightMirror)."""
        self.weights_version = max(self.pool.update_weights(state_dict))
        return self.weights_version

    ledger = None  # the calls live in the gateways' own ledgers

    def lineages(self, built: list[Any], tokenizer: Any = None) -> list[tuple[str, str]]:
        """No lineage pictures: the calls are in the gateways' ledgers (RUN_DIR/ledgers/)."""
        return []

    def close(self) -> None:
        self.pool.close()
