#!/usr/bin/env bash
# One environment with verl 0.9.1 AND rowgrove installed with its dependencies:
# `pip install 'rowgrove[verl]'` (editable here), resolved with verl's transformers (<5.11, 5.10.x).
# `make test` runs verl's integration suite (tests/integrations/test_verl.py) and rowgrove's core
# suites (algo, ledger, gateway, assemble) with this environment's python.
# The `verl` extra also names cachetools, uvicorn, fastapi, pyzmq and msgspec: verl's RayPPOTrainer
# and agent loop import them without declaring them.
# The exact versions come from locks/verl.txt (RELOCK=1 resolves afresh and rewrites it).
# Idempotent (stamp VENV/.installed). Usage: scripts/install_verl_env.sh [VENV_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env_lib.sh"
env_begin install_verl_env "${1:-${ROOT}/.venv-stack-verl}" "${ROOT}/locks/verl.txt" || exit 0

env_pip "torch==${TORCH_VERSION}" -e "${ROOT}[verl,dev]"
env_lock "pip install 'rowgrove[verl,dev]' (editable) torch==${TORCH_VERSION}"

# prove it: the CPU torch, verl's registries, and rowgrove's verl adapter and gateway import
"${VENV}/bin/python" - <<'PY'
import importlib.metadata as md

import torch

assert not torch.version.cuda, f"a CUDA torch got in: {torch.__version__}"
from verl import DataProto  # noqa: F401
from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss  # noqa: F401

import rowgrove.gateway  # noqa: F401
import rowgrove.integrations.verl  # noqa: F401  (registers the "rowgrove" estimator and loss)

print(f"install_verl_env: verl {md.version('verl')}, transformers {md.version('transformers')}, "
      f"torch {torch.__version__}, rowgrove {md.version('rowgrove')}")
PY
env_done
