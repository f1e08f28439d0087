#!/usr/bin/env bash
# Install verl (PyPI `verl`, CPU torch) into its own environment, .venv-verl, for the tests marked
# `trainers` that run verl's own loss code and for trying `rowgrove.integrations.verl`.
#
# Why a separate environment: verl 0.9.1 caps transformers < 5.11 (5.10.4 resolves), rowgrove pins
# transformers 5.23, so the two cannot share .venv. rowgrove goes in with --no-deps: the verl side
# only needs rowgrove.types, rowgrove.algo and rowgrove.integrations (numpy, which verl brings, and
# the OpenAI SDK for the agent loop's agents, pinned below as rowgrove pins it).
# verl's RayPPOTrainer and agent loop also import cachetools, uvicorn, fastapi, pyzmq and msgspec,
# which verl does not declare: they are pinned below.
#
# torch is installed first, alone and pinned (2.13.0, the CPU build in the local wheel folder), and
# pinned again in verl's resolve, so pip never reaches for a CUDA torch.
#
# Idempotent: a finished install leaves .venv-verl/.installed holding the pins below; when the
# stamp matches, the script returns at once. Usage: scripts/install_verl_env.sh [VENV_DIR]
set -euo pipefail

VERL_VERSION="0.9.1"
TORCH_VERSION="2.13.0"
EXTRAS=("cachetools==8.0.2" "uvicorn==0.54.0" "fastapi==0.165.0" "pyzmq==27.3.0" "msgspec==0.23.0")
# rowgrove's own pin of the OpenAI SDK: the "rowgrove" agent loop's agents are OpenAI clients
ROWGROVE_DEPS=("openai==3.51.0")
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${ROOT}/.venv-verl}"
PYTHON="${PYTHON:-python3}"
STAMP="${VENV}/.installed"
WANT="verl==${VERL_VERSION} torch==${TORCH_VERSION} ${EXTRAS[*]} ${ROWGROVE_DEPS[*]} install_verl_env v2"

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${WANT}" && -x "${VENV}/bin/python" ]]; then
    echo "install_verl_env: ${VENV} is up to date (${WANT})"
    exit 0
fi

start=$(date +%s)
rm -f "${STAMP}"
if [[ ! -x "${VENV}/bin/python" ]]; then
    "${PYTHON}" -m venv "${VENV}"
fi
PIP=("${VENV}/bin/python" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install "torch==${TORCH_VERSION}"
"${PIP[@]}" install "verl==${VERL_VERSION}" "torch==${TORCH_VERSION}" "${EXTRAS[@]}" "${ROWGROVE_DEPS[@]}"
# rowgrove itself, editable so the tests see this checkout; no deps (they pin transformers 5.23: pip
# then warns that rowgrove wants transformers 5.23, which is expected, the core is not used here)
"${PIP[@]}" install --no-deps --no-build-isolation -e "${ROOT}" 2>/dev/null \
    || "${PIP[@]}" install --no-deps -e "${ROOT}"

# prove it: the CPU torch, verl's registries, and rowgrove's verl adapter import
"${VENV}/bin/python" - <<'PY'
import importlib.metadata as md

import torch

assert "+cpu" in torch.__version__ or not torch.version.cuda, f"a CUDA torch got in: {torch.__version__}"
from verl import DataProto  # noqa: F401
from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss  # noqa: F401

import rowgrove.integrations.verl  # noqa: F401  (registers the "rowgrove" estimator and loss)

print(f"install_verl_env: verl {md.version('verl')}, transformers {md.version('transformers')}, torch {torch.__version__}")
PY
echo "${WANT}" > "${STAMP}"
echo "install_verl_env: done in $(( $(date +%s) - start )) s"
