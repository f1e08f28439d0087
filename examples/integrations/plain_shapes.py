"""Rows in the shapes of slime, SkyRL and prime-rl (dicts with their field names; no package
needed). Build the real objects with `Sample(**d)` / `TrainingSample(**d)`; SkyRL's
GeneratorOutput is a TypedDict (trajectory ids: `TrajectoryID(**t)`).

    python examples/integrations/plain_shapes.py
"""

from types import SimpleNamespace

from rowgrove.integrations.plain import (
    rows_to_prime_samples,
    rows_to_skyrl_output,
    rows_to_slime_samples,
    slime_reward_post_process,
)
from rowgrove.types import Row

rows = [
    Row("a", "q", input_ids=[5, 6, 7, 8], loss_mask=[0, 1, 1, 0], reward=1.0, logprobs=[0, -0.5, -0.4, 0]),
    Row("a", "q", input_ids=[5, 9, 7, 8, 3], loss_mask=[0, 0, 0, 0, 1], reward=1.0, logprobs=[0, 0, 0, 0, -0.2]),
    Row("b", "q", input_ids=[5, 6, 4], loss_mask=[0, 0, 1], reward=0.0, logprobs=[0, 0, -1.0]),
]

samples = rows_to_slime_samples(rows)
# slime: --custom-reward-post-process-path rowgrove.integrations.plain.slime_reward_post_process
raw, adv = slime_reward_post_process(SimpleNamespace(advantage_estimator="grpo", grpo_std_normalization=True), samples)
print("slime rollout_id:", [s["rollout_id"] for s in samples], "advantages:", [round(a, 4) for a in adv])

out = rows_to_skyrl_output(rows)  # generator.step_wise_trajectories=true
print("SkyRL is_last_step:", out["is_last_step"], "trajectory_ids:", out["trajectory_ids"])

prime = rows_to_prime_samples(rows, env_name="my-env", loss_mode="rollout-mean")
print("prime-rl rl_weights:", [s["rl_weights"] for s in prime])
