"""The verl side of tests/integrations/test_verl.py, run with verl's own environment (.venv-stack-verl:
verl caps transformers < 5.11, below the main .venv's lock). Prints one JSON object of
measured numbers; the pytest side asserts on them.

What it measures, with verl's real functions:
  - `compute_advantage(data, "rowgrove")` (verl/trainer/ppo/ray_trainer.py) vs the advantages
    `rows_to_dataproto` wrote;
  - the gradient, w.r.t. each sampled token's log-prob, of verl's registered "rowgrove" policy loss
    summed over verl's micro-batches (`prepare_micro_batches`, fixed and dynamic batch size, dp 1
    and 2), for rollouts split into 1-4 rows, vs the gradient of rowgrove's loss on unsplit rows;
  - the same batch through verl's built-in "grpo" estimator and "vanilla" loss with
    "seq-mean-token-mean": the bias, as numbers.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from rowgrove.algo import assign_advantages, loss_weights  # noqa: E402
from rowgrove.errors import InputError  # noqa: E402
from rowgrove.integrations import verl as rv  # noqa: E402
from rowgrove.types import Row  # noqa: E402

CLIP = 0.2


def rollouts(seed: int, sizes: tuple[int, ...] = (3, 2, 1, 4)) -> list[Row]:
    """One row per rollout, groups of uneven sizes: a prompt, then 4 sampled segments (mask 1)
    separated by tool output (mask 0); engine logprobs on sampled tokens; 0/1 rewards."""
    rng = np.random.default_rng(seed)
    out = []
    for g, size in enumerate(sizes):
        for k in range(size):
            ids = [int(x) for x in rng.integers(5, 60, int(rng.integers(3, 7)))]
            mask = [0] * len(ids)
            for s in range(4):
                n = int(rng.integers(2, 6))
                ids += [int(x) for x in rng.integers(5, 60, n)]
                mask += [1] * n
                m = int(rng.integers(1, 4))
                ids += [int(x) for x in rng.integers(5, 60, m)]
                mask += [0] * m
            lp = [float(-rng.uniform(0.2, 3.0)) if b else 0.0 for b in mask]
            out.append(Row(f"r{g}-{k}", f"g{g}", ids, mask, reward=float(rng.integers(0, 2)), logprobs=lp))
    return out


def split(row: Row, k: int) -> list[Row]:
    """k rows of one rollout, cut at the starts of its sampled segments: row j ends where segment
    j+1 begins and trains only its own segments; every row keeps its full prefix as prompt."""
    mask = np.asarray(row.loss_mask)
    starts = [t for t in range(1, len(mask)) if mask[t] and not mask[t - 1]]
    k = min(k, len(starts))
    cuts = starts[:k][1:] + [len(mask)]
    out, begin = [], 0
    for j, end in enumerate(cuts):
        m = [0] * begin + list(mask[begin:end])
        lp = [0.0] * begin + list(row.logprobs[begin:end])
        out.append(Row(row.rollout_id, row.group_id, list(row.input_ids[:end]), m, reward=row.reward,
                       logprobs=lp, segment=j))
        begin = end
    return out


def reference_loss(theta: dict[str, torch.Tensor], rows: list[Row], mode: str) -> torch.Tensor:
    """rowgrove's loss on unsplit rows: sum of w * -min(r A, clip(r) A), r = exp(theta - engine)."""
    rows = assign_advantages(rows)
    total = torch.zeros((), dtype=torch.float64)
    for row, w in zip(rows, loss_weights(rows, mode), strict=True):
        t = torch.as_tensor(np.asarray(row.loss_mask) != 0)
        lp = theta[row.rollout_id][t]
        old = torch.as_tensor(np.asarray(row.logprobs, np.float64))[t]
        r = torch.exp(lp - old)
        a = float(row.advantage)
        total = total - (torch.as_tensor(w)[t] * torch.minimum(r * a, r.clamp(1 - CLIP, 1 + CLIP) * a)).sum()
    return total


def verl_grad(data, theta, *, agg: str, micro: str, dp: int, loss: str = "rowgrove") -> dict[str, np.ndarray]:
    """Gradient of verl's policy loss summed over verl's micro-batches (dp ranks averaged, as
    FSDP does) w.r.t. theta. log_prob of response token j of row i = theta[rollout][start_i + j]."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    fn = get_policy_loss_fn(loss)
    N, R = data.batch["responses"].shape
    P = data.batch["prompts"].shape[1]
    starts = data.batch["attention_mask"][:, :P].sum(-1)
    for v in theta.values():
        v.grad = None
    T = int(data.batch["response_mask"].sum())
    ranks = np.array_split(np.arange(N), dp)
    for rank_rows in ranks:
        rank_rows = torch.as_tensor(rank_rows)
        td = tu.get_tensordict({"input_ids": data.batch["input_ids"][rank_rows],
                                "attention_mask": data.batch["attention_mask"][rank_rows],
                                "row_index": rank_rows})
        if micro == "dynamic":
            tu.assign_non_tensor(td, use_dynamic_bsz=True, max_token_len_per_gpu=int(data.batch["attention_mask"].shape[1] * 2))
        else:
            size = int(micro)
            tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=size)
            if len(rank_rows) % size:
                raise SystemExit(f"rank of {len(rank_rows)} rows is not divisible by micro size {size}")
        mbs, _ = prepare_micro_batches(td)
        for mb in mbs:
            idx = mb["row_index"]
            lp = torch.zeros(len(idx), R, dtype=torch.float64)
            lp_rows = []
            for a, i in enumerate(idx.tolist()):
                rid = data.non_tensor_batch["rollout_id"][i]
                n = int(data.batch["attention_mask"][i, P:].sum())
                s = int(starts[i])
                lp_rows.append(torch.cat([theta[rid][s:s + n], torch.zeros(R - n, dtype=torch.float64)]))
            lp = torch.stack(lp_rows)
            cfg = OmegaConf.create({"clip_ratio": CLIP, "clip_ratio_low": CLIP, "clip_ratio_high": CLIP,
                                    "clip_ratio_c": 3.0,
                                    "global_batch_info": {"dp_size": dp, "batch_num_tokens": T,
                                                          "global_batch_size": N}})
            pg, _ = fn(old_log_prob=data.batch["old_log_probs"][idx].double(), log_prob=lp,
                       advantages=data.batch["advantages"][idx].double(),
                       response_mask=data.batch["response_mask"][idx].bool(), loss_agg_mode=agg, config=cfg)
            (pg / dp).backward()  # FSDP averages the ranks' gradients
    return {k: v.grad.detach().numpy().copy() for k, v in theta.items()}


def verl_grad_ppo_loss(data, theta, *, agg: str, micro: str, dp: int) -> dict[str, np.ndarray]:
    """As `verl_grad`, but through `ppo_loss` (verl/workers/utils/losses.py), the function verl's
    FSDP engine calls on each micro-batch, with the batch in verl's no-padding layout
    (`left_right_2_no_padding`) and an `ActorConfig` naming the "rowgrove" policy loss. The model's
    output is a flat log-prob per token, position p scoring token p+1, as the engine returns it."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    N = len(data)
    P = data.batch["prompts"].shape[1]
    T = int(data.batch["response_mask"].sum())
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_mini_batch_size=N, ppo_micro_batch_size_per_gpu=1,
                      loss_agg_mode=agg, clip_ratio=CLIP, policy_loss=PolicyLossConfig(loss_mode="rowgrove"))
    for v in theta.values():
        v.grad = None
    for rank_rows in np.array_split(np.arange(N), dp):
        rank = data.select_idxs(rank_rows.tolist())
        td = left_right_2_no_padding(rank.to_tensordict())
        td["row_index"] = torch.as_tensor(rank_rows)
        tu.assign_non_tensor(td, dp_size=dp, batch_num_tokens=T, global_batch_size=N)
        if micro == "dynamic":
            tu.assign_non_tensor(td, use_dynamic_bsz=True, max_token_len_per_gpu=int(data.batch["attention_mask"].shape[1] * 2))
        else:
            tu.assign_non_tensor(td, use_dynamic_bsz=False, micro_batch_size_per_gpu=int(micro))
        mbs, _ = prepare_micro_batches(td)
        for mb in mbs:
            flat = []
            for i in mb["row_index"].tolist():
                rid = data.non_tensor_batch["rollout_id"][i]
                s = int(data.batch["attention_mask"][i, :P].sum())
                n = int(data.batch["attention_mask"][i, P:].sum())
                lp = torch.zeros(s + n, dtype=torch.float64)
                # position p holds the log-prob of token p+1: response token j sits at s - 1 + j
                lp = lp.index_put((torch.arange(s - 1, s - 1 + n),), theta[rid][s:s + n])
                flat.append(lp)
            log_probs = torch.nested.nested_tensor_from_jagged(torch.cat(flat),
                                                              offsets=mb["input_ids"].offsets())
            loss, _ = ppo_loss(cfg, {"log_probs": log_probs}, mb)
            (loss / dp).backward()  # FSDP averages the ranks' gradients
    return {k: v.grad.detach().numpy().copy() for k, v in theta.items()}


def rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    num = sum(float(np.abs(a[k] - b[k]).sum()) for k in a)
    den = sum(float(np.abs(b[k]).sum()) for k in b)
    return num / den


def copy(data):
    """A DataProto with its own tensors (verl's compute_advantage writes into the batch)."""
    from verl import DataProto

    return DataProto.from_dict(tensors={k: v.clone() for k, v in data.batch.items()},
                               non_tensors={k: v.copy() for k, v in data.non_tensor_batch.items()},
                               meta_info=dict(data.meta_info))


def coef_sums(data) -> dict[str, float]:
    """Per rollout: the sum over its rows and tokens of the advantages verl reads (A x w x C)."""
    out: dict[str, float] = {}
    adv = data.batch["advantages"].double()
    for i, rid in enumerate(data.non_tensor_batch["rollout_id"]):
        out[rid] = out.get(rid, 0.0) + float(adv[i].sum())
    return out


def main() -> None:
    from verl.trainer.ppo.core_algos import agg_loss
    from verl.trainer.ppo.ray_trainer import compute_advantage

    res: dict[str, object] = {}
    base = rollouts(7)
    rng = np.random.default_rng(3)
    theta = {r.rollout_id: torch.tensor(np.asarray(r.logprobs) + rng.uniform(-0.4, 0.4, len(r.logprobs)),
                                        dtype=torch.float64, requires_grad=True) for r in base}
    k_of = {r.rollout_id: 1 + i % 4 for i, r in enumerate(base)}  # 1, 2, 3, 4 rows
    split_rows = [x for r in base for x in split(r, k_of[r.rollout_id])]
    res["rows_per_rollout"] = {rid: sum(1 for x in split_rows if x.rollout_id == rid) for rid in k_of}
    res["group_sizes"] = [3, 2, 1, 4]

    grads: dict[str, float] = {}
    est: dict[str, float] = {}
    mass: dict[str, dict[str, float]] = {}
    for mode in ("token-mean", "rollout-mean"):
        ref_loss = reference_loss(theta, base, mode)
        for v in theta.values():
            v.grad = None
        ref_loss.backward()
        ref = {k: v.grad.detach().numpy().copy() for k, v in theta.items()}
        for agg in ("token-sum", "token-mean"):
            for name, rows in (("unsplit", base), ("split", split_rows)):
                data = rv.rows_to_dataproto(rows, pad_token_id=0, loss_mode=mode, loss_agg_mode=agg)
                got = compute_advantage(copy(data), adv_estimator="rowgrove")
                est[f"{mode}/{agg}/{name}"] = float((got.batch["advantages"] - data.batch["advantages"]).abs().max())
                mass[f"{mode}/{agg}/{name}"] = coef_sums(data)
                n = len(data)
                for micro in ("1", "2", "3", "dynamic"):
                    for dp in (1, 2):
                        per_rank = [len(x) for x in np.array_split(np.arange(n), dp)]
                        if micro != "dynamic" and any(k % int(micro) for k in per_rank):
                            continue
                        g = verl_grad(data, theta, agg=agg, micro=micro, dp=dp)
                        grads[f"{mode}/{agg}/{name}/micro={micro}/dp={dp}"] = rel(g, ref)
                        if micro in ("1", "dynamic"):
                            g = verl_grad_ppo_loss(data, theta, agg=agg, micro=micro, dp=dp)
                            grads[f"ppo_loss/{mode}/{agg}/{name}/micro={micro}/dp={dp}"] = rel(g, ref)
    res["grad_rel_diff"] = grads
    res["estimator_max_abs_diff"] = est
    res["coef_sum"] = mass

    # verl's built-in path on the same split batch: grpo over rows, seq-mean-token-mean per row
    data = rv.rows_to_dataproto(split_rows, pad_token_id=0)
    plain = copy(data)
    plain.non_tensor_batch["uid"] = np.array([str(u) for u in plain.non_tensor_batch["uid"]], dtype=object)
    plain = compute_advantage(plain, adv_estimator="grpo")
    # control: the same split batch through verl's "vanilla" loss and "seq-mean-token-mean" on verl's
    # grpo advantages moves the gradient away from rowgrove's (the check above can fail)
    ref_loss = reference_loss(theta, base, "rollout-mean")
    for v in theta.values():
        v.grad = None
    ref_loss.backward()
    ref = {k: v.grad.detach().numpy().copy() for k, v in theta.items()}
    g = verl_grad(plain, theta, agg="seq-mean-token-mean", micro="1", dp=1, loss="vanilla")
    res["control_grad_rel_diff"] = rel(g, ref)
    res["verl_grpo_row_adv"] = [float(plain.batch["advantages"][i][data.batch["response_mask"][i].bool()][0])
                                for i in range(len(data))]
    res["row_rollout"] = [str(r) for r in data.non_tensor_batch["rollout_id"]]
    res["rowgrove_adv"] = {r.rollout_id: float(r.advantage) for r in assign_advantages(split_rows)}

    # hand example: group q, rollout a (reward 1) compacted into 3 rows, rollout b (reward 0) one row
    a = Row("a", "q", [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 1, 1, 0, 1, 1, 0, 1, 1], reward=1.0,
            logprobs=[0, -.5, -.5, 0, -.5, -.5, 0, -.5, -.5])
    b = Row("b", "q", [1, 2, 3, 4, 5, 6], [0, 1, 1, 1, 1, 1], reward=0.0, logprobs=[0, -.5, -.5, -.5, -.5, -.5])
    hand = split(a, 3) + [b]
    hd = rv.rows_to_dataproto(hand, pad_token_id=0, loss_mode="rollout-mean")
    hp = copy(hd)
    hp.non_tensor_batch["uid"] = np.array([str(u) for u in hp.non_tensor_batch["uid"]], dtype=object)
    hp = compute_advantage(hp, adv_estimator="grpo")
    res["hand"] = {
        "rows": [str(r) for r in hd.non_tensor_batch["rollout_id"]],
        "verl_grpo": [float(hp.batch["advantages"][i][hd.batch["response_mask"][i].bool()][0]) for i in range(len(hd))],
        "rowgrove_adv": [float(r.advantage) for r in assign_advantages(hand)],
        "coef_sum": coef_sums(hd),
        "coef": [[round(float(x), 12) for x in hd.batch["advantages"][i][hd.batch["response_mask"][i].bool()]]
                 for i in range(len(hd))],
    }
    # verl's seq-mean-token-mean over these 4 rows, each token's loss 1: a row's mass is 1/4
    ones = torch.ones_like(hd.batch["response_mask"], dtype=torch.float64, requires_grad=True)
    agg_loss(loss_mat=ones, loss_mask=hd.batch["response_mask"].bool(), loss_agg_mode="seq-mean-token-mean").backward()
    res["hand"]["verl_seq_mean_token_mean_mass"] = {}
    for i, rid in enumerate(hd.non_tensor_batch["rollout_id"]):
        m = res["hand"]["verl_seq_mean_token_mean_mass"]
        m[rid] = m.get(rid, 0.0) + float(ones.grad[i].sum())

    # refusals, with their messages
    refusals = {}
    for label, call in (
        ("seq-agg", lambda: rv.rows_to_dataproto(base, pad_token_id=0, loss_agg_mode="seq-mean-token-mean")),
        ("seq-mode", lambda: rv.rows_to_dataproto(base, pad_token_id=0, loss_mode="seq-mean-token-mean")),
        ("no-group", lambda: rv.rows_to_dataproto([Row("x", None, [1, 2, 3], [0, 1, 1], reward=1.0, logprobs=[0, -1, -1])],
                                                  pad_token_id=0)),
        ("plain-uid", lambda: rv.compute_rowgrove_advantage(torch.zeros(1, 2), torch.ones(1, 2),
                                                            np.array(["g"], dtype=object))),
        ("loss-agg", lambda: rv.compute_rowgrove_policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2),
                                                             torch.ones(1, 2), "seq-mean-token-mean")),
        ("config", lambda: rv.check_verl_config({"algorithm": {"adv_estimator": "grpo"},
                                                 "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2,
                                                                                 "use_kl_loss": True},
                                                                       "rollout": {"n": 4}}}, n_rows=12)),
    ):
        try:
            call()
            refusals[label] = None
        except InputError as e:
            refusals[label] = str(e)
    from rowgrove.algo import assign_advantages as aa
    try:
        aa([Row("x", None, [1, 2, 3], [0, 1, 1], reward=1.0, logprobs=[0, -1, -1])])
    except InputError as e:
        refusals["algo-no-group"] = str(e)
    res["refusals"] = refusals

    # invalid rows are dropped, counted
    bad = [Row("z", "g0", [1, 2, 3], [0, 1, 1], reward=0.0, valid=False, mask_reason="engine_error",
               logprobs=[0, -1, -1])]
    d = rv.rows_to_dataproto(base + bad, pad_token_id=0)
    res["dropped"] = d.meta_info["rowgrove"]
    # a partial group (g0 lost rollout z): the baseline is over g0's valid rollouts, as without z
    alone = rv.rows_to_dataproto(base, pad_token_id=0)
    res["partial_group_max_abs_diff"] = float((d.batch["advantages"] - alone.batch["advantages"]).abs().max())
    res["fields"] = sorted(d.batch.keys())
    res["non_tensor"] = sorted(d.non_tensor_batch.keys())
    res["row0"] = {"prompts": d.batch["prompts"][0].tolist(), "responses": d.batch["responses"][0].tolist(),
                   "attention_mask": d.batch["attention_mask"][0].tolist(), "position_ids": d.batch["position_ids"][0].tolist(),
                   "response_mask": d.batch["response_mask"][0].tolist(), "input_ids": base[0].input_ids,
                   "loss_mask": base[0].loss_mask, "uid": str(d.non_tensor_batch["uid"][0]),
                   "uid_type": type(d.non_tensor_batch["uid"][0]).__name__}
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
