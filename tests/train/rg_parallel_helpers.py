"""Workers for the data-parallel tests: module-level functions, so that spawned ranks can unpickle them."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from rg_train_helpers import split_row, synthetic_rollouts, tiny_llama


def uneven_rows():
    """12 rollouts of 3 groups with advantages; every other rollout split into two rows."""
    from rowgrove.algo import assign_advantages

    rows = assign_advantages(synthetic_rollouts(), estimator="grpo")
    out = []
    for i, r in enumerate(rows):
        gen = [k for k, m in enumerate(r.loss_mask) if m]
        out += split_row(r, gen[len(gen) // 2]) if i % 2 == 0 else [r]
    return out


UPDATE = dict(rollouts_per_minibatch=5, microbatch_tokens=48, clip_eps=0.2, seed=3, max_grad_norm=1.0)


def one_update(model, rows, mode, dp=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return update_policy_call(model, opt, rows, mode, dp)


def update_policy_call(model, opt, rows, mode, dp):
    from rowgrove.train.update import update_policy

    return update_policy(model, opt, rows, loss_mode=mode, dp=dp, **UPDATE)


def dp_update_worker(out: str, modes: list[str]) -> None:
    """On every rank: the tiny model, one data-parallel update per mode; rank 0 saves the result."""
    from rowgrove.train.parallel import DataParallel

    torch.set_num_threads(1)
    rank = dist.get_rank()
    for mode in modes:
        model = tiny_llama(0)
        dp = DataParallel(model)
        stats = one_update(model, uneven_rows() if rank == 0 else None, mode, dp)
        if rank == 0:
            torch.save({"params": [p.detach().clone() for p in model.parameters()], "stats": stats},
                       Path(out) / f"{mode}.pt")


if __name__ == "__main__":  # under torchrun: the process group comes from its environment
    import sys

    from rowgrove.train.parallel import init_from_env

    assert init_from_env("cpu")
    try:
        dp_update_worker(sys.argv[1], sys.argv[2:])
        dist.barrier()  # both ranks done before either tears down (rank 0 hosts the store; a rank
        # that left early once aborted rank 0's teardown: "terminate called without an active exception")
    finally:
        dist.destroy_process_group()
