"""Data-parallel training on torch.distributed: the same update on every rank, with global divisors.

    rank 0: gateway, rollouts, rows ──► mini-batches of whole rollouts (one process decides)
                                        │ each mini-batch's rows dealt to the ranks by tokens
                                        ▼ (scatter_object_list)
    every rank: its share ──► per-rollout counts ──all-reduce──► loss_weights(share, counts=)
                          ──► micro-batches, backward under DDP.no_sync ──► one sync pass:
                              gradients all-reduced as a SUM ──► clip, optimizer step

The loss weights already carry every divisor (1/T under token-mean, 1/(R T_r) under
rollout-mean), computed from counts summed over the ranks, so each rank's loss is its part of
the one-process loss and the update's gradient is the plain sum of the ranks' gradients. DDP's
default hook averages (divides by the world size); here a comm hook sums instead. However the rows
are dealt, and whatever the number of ranks, each optimizer update is the update of one process
(up to the order of floating-point sums).

Ranks run different numbers of micro-batches (a rank may get no rows at all), so every
micro-batch runs under `no_sync()` and each mini-batch ends with one zero-weight pass outside it,
the point where DDP all-reduces the accumulated gradients (the pattern the DDP docs give for
gradient accumulation).

`launch(fn, nproc, *args)` starts `nproc` local processes (torch.multiprocessing spawn, gloo on
CPU, NCCL on GPU, a file rendezvous); under `torchrun` the process group comes from its
environment (`init_from_env`).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rowgrove.algo import RolloutCounts, minibatches, rollout_counts, split_across_ranks
from rowgrove.errors import InputError, RowgroveError
from rowgrove.types import Row


@dataclass
class Share:
    """One rank's part of one mini-batch: the mini-batch's rollout ids (the same on every rank,
    the index of the all-reduced counts) and the rows dealt to this rank."""

    ids: list[str]
    rows: list[Row]


def _sum_hook(state, bucket):  # type: ignore[no-untyped-def]
    """DDP comm hook (object, dist.GradBucket) -> Future[Tensor]: all-reduce a gradient bucket as
    a SUM (the default hook divides by the world size; the loss weights already hold the global
    divisors). No annotations: DDP compares them to its own classes, and this module's are strings."""
    fut = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


class DataParallel:
    """This process's rank in an initialized process group, and the model wrapped in DDP.

    `ddp` is what the update calls forward through; `module` is the plain model (state dicts,
    the engine's weight sync, checkpoints: one layout whatever the rank count)."""

    def __init__(self, model: torch.nn.Module):
        if not dist.is_initialized():
            raise RowgroveError("DataParallel needs an initialized torch.distributed process group")
        from torch.nn.parallel import DistributedDataParallel

        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = next(model.parameters()).device
        self.module = model
        # broadcasts rank 0's parameters: every rank starts from the same weights
        self.ddp = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.ddp.register_comm_hook(None, _sum_hook)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled)."""
        return broadcast(obj)

    def scatter_minibatches(self, rows: Sequence[Row] | None, rollouts_per_minibatch: int, seed: int) -> list[Share]:
        """Rank 0 cuts its rows into mini-batches of whole rollouts (`minibatches`), deals each
        one's rows to the ranks (`split_across_ranks`) and sends every rank its shares; the
        other ranks pass rows=None. Every rank gets the same number of shares."""
        plan: list[list[Share]] | None = None
        if self.is_main:
            if rows is None:
                raise RowgroveError("rank 0 holds the step's rows: pass them to scatter_minibatches")
            plan = [[] for _ in range(self.world_size)]
            for mb in minibatches(rows, rollouts_per_minibatch, seed=seed):
                ids = list(dict.fromkeys(r.rollout_id for r in mb))
                for rank, part in enumerate(split_across_ranks(mb, self.world_size)):
                    plan[rank].append(Share(ids, part))
        box: list[Any] = [None]
        dist.scatter_object_list(box, plan, src=0)  # NCCL: the current CUDA device (set per rank)
        return box[0]

    def global_counts(self, share: Share) -> RolloutCounts:
        """The per-rollout counts of the whole mini-batch: this share's, summed over the ranks."""
        local = torch.as_tensor(rollout_counts(share.rows, share.ids).as_array(), dtype=torch.float64,
                                device=self.device)
        dist.all_reduce(local, op=dist.ReduceOp.SUM)
        return RolloutCounts.from_array(share.ids, local.cpu().numpy())

    @contextmanager
    def accumulate(self) -> Iterator[None]:
        """Backward passes inside only accumulate gradients locally (DDP.no_sync)."""
        with self.ddp.no_sync():
            yield

    def sync_gradients(self) -> None:
        """One zero-weight forward/backward outside no_sync: DDP all-reduces (sums) the gradients
        accumulated since the last sync. Every rank must call it once per mini-batch."""
        from rowgrove.train.update import build_microbatches, microbatch_logits

        dummy = Row(rollout_id="sync", group_id=None, input_ids=[0, 0], loss_mask=[0, 1], logprobs=[0.0, 0.0],
                    advantage=0.0)
        mb = build_microbatches([dummy], [np.zeros(2)], capacity=2, device=self.device)[0]
        (microbatch_logits(self.ddp, mb).float().sum() * 0.0).backward()

    def sum_stats(self, values: dict[str, float]) -> dict[str, float]:
        """`values` summed over the ranks (metric sums: tokens, clipped, kl, ...)."""
        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return dict(zip(keys, t.cpu().tolist(), strict=True))

    def barrier(self) -> None:
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank of the initialized process group (pickled)."""
    box = [obj if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)  # NCCL: through the current CUDA device (set per rank)
    return box[0]


def backend_for(device: str) -> str:
    """nccl for CUDA devices, gloo otherwise."""
    return "nccl" if str(device).startswith("cuda") else "gloo"


def init_from_env(device: str = "cpu") -> bool:
    """Join the process group `torchrun` describes (WORLD_SIZE > 1 in the environment); False
    when there is none (one process). Already initialized: True."""
    if dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if str(device).startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend_for(device))
    return True


def local_device(device: str) -> str:
    """The device of this rank: `cuda` becomes `cuda:LOCAL_RANK` under a process group."""
    if device == "cuda" and dist.is_initialized():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def _worker(rank: int, fn: Callable[..., Any], nproc: int, init_file: str, device: str, args: tuple) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc))
    if device.startswith("cuda"):
        torch.cuda.set_device(rank)
    dist.init_process_group(backend_for(device), init_method=f"file://{init_file}", rank=rank, world_size=nproc)
    try:
        fn(*args)
        # every rank finished before any tears the group down: a rank leaving early made rank 0
        # abort in teardown ("terminate called without an active exception") after its work was saved
        dist.barrier()
    except RowgroveError as e:  # one line, as the CLI prints it; the parent exits 2
        print(f"rowgrove (rank {rank}): {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[..., Any], nproc: int, *args: Any, device: str = "cpu") -> int:
    """Run `fn(*args)` in `nproc` new local processes joined in one process group (gloo on CPU,
    NCCL with a CUDA `device`, one GPU per rank); returns 0, or 2 when a rank failed on a
    RowgroveError (it printed why). `fn` and `args` must be picklable (spawn)."""
    import torch.multiprocessing as mp

    if nproc < 1:
        raise InputError(f"--nproc must be at least 1, got {nproc}")
    if device.startswith("cuda") and torch.cuda.device_count() < nproc:
        raise InputError(f"--nproc {nproc} with device {device} needs {nproc} GPUs, "
                         f"this machine has {torch.cuda.device_count()}: lower --nproc")
    with tempfile.TemporaryDirectory(prefix="rowgrove-dist-") as tmp:
        init_file = str(Path(tmp) / "rendezvous")
        try:
            mp.start_processes(_worker, args=(fn, nproc, init_file, device, args), nprocs=nproc,
                               start_method="spawn")
        except mp.ProcessExitedException as e:
            if e.exit_code == 2:
                return 2
            raise
    return 0
