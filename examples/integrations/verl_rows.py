"""Rows into verl 0.9.1: rows_to_dataproto, then verl's own advantage and policy-loss code
("rowgrove" estimator and policy loss, registered on import), aggregated with
loss_agg_mode="token-sum". Run it in verl's environment:

    scripts/install_verl_env.sh .venv-stack-verl && .venv-stack-verl/bin/python examples/integrations/verl_rows.py
"""

import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.ray_trainer import compute_advantage

from rowgrove.integrations.verl import check_verl_config, rows_to_dataproto
from rowgrove.types import Row

# One group: rollout "a" (reward 1) was compacted into two rows, rollout "b" (reward 0) is one row.
# Loss mask 1 = tokens the engine sampled; logprobs = the engine's at those tokens.
rows = [
    Row("a", "q", input_ids=[5, 6, 7, 8], loss_mask=[0, 1, 1, 0], reward=1.0, logprobs=[0, -0.5, -0.4, 0]),
    Row("a", "q", input_ids=[5, 9, 7, 8, 3], loss_mask=[0, 0, 0, 0, 1], reward=1.0, logprobs=[0, 0, 0, 0, -0.2]),
    Row("b", "q", input_ids=[5, 6, 4], loss_mask=[0, 0, 1], reward=0.0, logprobs=[0, 0, -1.0]),
]
data = rows_to_dataproto(rows, pad_token_id=0, loss_mode="rollout-mean", loss_agg_mode="token-sum")
print("uid:", list(data.non_tensor_batch["uid"]), "rollout_id:", list(data.non_tensor_batch["rollout_id"]))
print("advantages (A x w):", data.batch["advantages"])

# verl's trainer recomputes advantages with the configured estimator: "rowgrove" gives the same.
again = compute_advantage(data, adv_estimator="rowgrove")
assert torch.allclose(again.batch["advantages"], data.batch["advantages"])

# verl's policy loss "rowgrove" with token-sum aggregation: the loss is rowgrove's, whatever the
# micro-batching. Here the current policy equals the sampler, so the ratio is 1.
loss_fn = get_policy_loss_fn("rowgrove")
actor = OmegaConf.create({"clip_ratio": 0.2, "global_batch_info": {"dp_size": 1}})
log_prob = data.batch["old_log_probs"].clone().requires_grad_(True)
loss, metrics = loss_fn(old_log_prob=data.batch["old_log_probs"], log_prob=log_prob,
                        advantages=data.batch["advantages"], response_mask=data.batch["response_mask"].bool(),
                        loss_agg_mode="token-sum", config=actor)
loss.backward()
print("loss:", loss.item(), "d loss / d log_prob:", log_prob.grad)

# The trainer settings under which verl's loss stays rowgrove's (raises naming any that do not):
check_verl_config({
    "algorithm": {"adv_estimator": "rowgrove"},
    "actor_rollout_ref": {"actor": {"policy_loss": {"loss_mode": "rowgrove"}, "loss_agg_mode": "token-sum",
                                    "ppo_mini_batch_size": 4, "use_kl_loss": False, "entropy_coeff": 0.0},
                          "rollout": {"n": 1}},
}, n_rows=len(data))
print("config ok")
