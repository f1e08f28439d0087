"""Data-parallel updates with torch.distributed (gloo, 2 CPU processes started by torchrun): the
2-rank update equals the 1-rank update in both loss modes, with rollouts split into rows that are
dealt unevenly. (`rowgrove train --nproc`'s own launcher is tested in test_train_nproc.py.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rg_parallel_helpers import UPDATE, one_update, uneven_rows
from rg_train_helpers import tiny_llama

from rowgrove.algo import minibatches, split_across_ranks

HERE = Path(__file__).resolve().parent

MODES = ["token-mean", "rollout-mean"]


def test_the_rows_are_dealt_unevenly():
    # the property the equality below rests on: ranks hold different row counts, and some
    # rollout has rows on both ranks (its T_r and the step's T are only known after the all-reduce)
    spans, uneven = 0, 0
    for mb in minibatches(uneven_rows(), UPDATE["rollouts_per_minibatch"], seed=UPDATE["seed"]):
        a, b = split_across_ranks(mb, 2)
        uneven += len(a) != len(b)
        spans += len({r.rollout_id for r in a} & {r.rollout_id for r in b})
    assert uneven >= 1 and spans >= 1


@pytest.mark.slow  # two spawned ranks import torch and transformers: tens of seconds on 2 cores
def test_two_ranks_update_like_one(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                    "--master-addr", "127.0.0.1", "--master-port", str(port),
                    str(HERE / "rg_parallel_helpers.py"), str(tmp_path), *MODES],
                   env=env, check=True, timeout=600)
    for mode in MODES:
        single = tiny_llama(0)
        stats_1 = one_update(single, uneven_rows(), mode)
        got = torch.load(tmp_path / f"{mode}.pt")
        start = tiny_llama(0)
        moved = 0.0
        for p1, p2, p0 in zip(single.parameters(), got["params"], start.parameters(), strict=True):
            torch.testing.assert_close(p2, p1.detach(), rtol=0, atol=1e-6)
            moved = max(moved, float((p1.detach() - p0.detach()).abs().max()))
        assert moved > 1e-4  # the update did something (3 AdamW steps at lr 1e-3)
        assert got["stats"]["updates"] == stats_1["updates"] == 3
        assert got["stats"]["tokens_trained"] == stats_1["tokens_trained"]  # summed over the ranks
        assert got["stats"]["loss"] == pytest.approx(stats_1["loss"], abs=1e-6)
