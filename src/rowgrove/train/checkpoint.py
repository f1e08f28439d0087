"""Checkpoints that resume a run exactly: model, optimizer, scheduler, step, RNG states (python,
numpy, torch) and the data position, written atomically.

Layout under the run directory:

    checkpoints/step-000004/state.pt   everything `load_checkpoint` returns
    checkpoints/latest                  the name of the newest complete checkpoint

A checkpoint is written to a temporary sibling directory and renamed into place, then `latest`
is replaced with os.replace: a crash at any moment leaves the previous checkpoint usable.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rowgrove.errors import InputError

KEEP = 2


@dataclass
class Checkpoint:
    """What a checkpoint holds. `step` is the number of completed steps; `data_position` is
    the index of the next prompt batch; `extra` is free-form (the trainer's running metrics)."""

    step: int
    data_position: int
    model: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any] | None
    rng: dict[str, Any]
    extra: dict[str, Any]


def rng_state() -> dict[str, Any]:
    """The global RNG states of python, numpy and torch (and CUDA when present)."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: str | Path, *, step: int, data_position: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write checkpoints/step-{step:06d} atomically, point `latest` at it, keep the newest two."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    state = {
        "step": step, "data_position": data_position,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": rng_state(), "extra": extra or {},
    }
    torch.save(state, tmp / "state.pt")
    final = root / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / "latest")
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-"))
    for old in done[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    try:
        name = (root / "latest").read_text().strip()
    except OSError:
        return None
    path = root / name
    return path if (path / "state.pt").is_file() else None


def load_checkpoint(run_dir: str | Path) -> Checkpoint:
    """The newest checkpoint of `run_dir`; InputError when there is none."""
    path = latest_checkpoint(run_dir)
    if path is None:
        raise InputError(f"no checkpoint in {run_dir} (no checkpoints/latest): "
                         "resume a run directory that saved one, or start a new run with --out")
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    return Checkpoint(step=state["step"], data_position=state["data_position"], model=state["model"],
                      optimizer=state["optimizer"], scheduler=state["scheduler"], rng=state["rng"],
                      extra=state["extra"])
