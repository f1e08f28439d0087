"""Rows into the trainers people already use: TRL, verl, and the plain shapes of slime, SkyRL and
prime-rl.

Each adapter lives in its own module behind an optional extra and imports the other system only
when it is used; none owns any math. They call `rowgrove.algo` (one advantage per rollout from
explicit group ids, per-token loss weights that do not depend on how many rows a rollout became)
and map its output onto the other system's fields, so that the other trainer's own loss code
computes rowgrove's loss:

    rowgrove.integrations.verl     rows_to_dataproto, the "rowgrove" estimator and policy loss
                                   (pip install 'rowgrove[verl]')
    rowgrove.integrations.verl_agent_loop, .verl_manager
                                   the "rowgrove" agent loop (its gateway samples through verl's
                                   server_manager) and the manager that takes several rows per rollout
    rowgrove.integrations.trl      RowgroveGRPOTrainer (pip install 'rowgrove[trl]')
    rowgrove.integrations.trl_async  RowgroveRolloutWorker, GatewayWeightTransfer for TRL's AsyncGRPO
    rowgrove.integrations.gateway_sync  GatewaySync: the trainer's weights into the gateway's engine,
                                   verified by a probe call (the one weight path of the trainers)
    rowgrove.integrations.harness  rollouts_to_rows: a harness over a gateway -> rows, for rows_fn
    rowgrove.integrations.plain    slime Sample / SkyRL GeneratorOutput / prime-rl TrainingSample
                                   as plain dicts (no package needed)

Nothing in rowgrove's core imports this package. See docs/integrations.md.
"""

__all__: list[str] = []
