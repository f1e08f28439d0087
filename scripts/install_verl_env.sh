#!/usr/bin/env bash
# Install verl (PyPI `verl`, CPU torch) into its own environment, .venv-verl, for the tests marked
# `trainers` that run verl's own loss code and for trying `rowgrove.integrations.verl`.
#
# Why a separate environment: verl 0.9.1 caps transformers < 5.11 (5.10.4 resolves), rowgrove pins
# transformers 5.23, so the two cannot share .venv. rowgrove goes in with --no-deps: the verl side
# only needs rowgrove.types, rowgrove.algo and rowgrove.integrations (numpy, which verl brings, and
# the OpenAI SDK for the agent loop's agents, at rowgrove's own pin).
# verl's RayPPOTrainer and agent loop also import cachetools, uvicorn, fastapi, pyzmq and msgspec,
# which verl does not declare. The pins are read from pyproject.toml's `verl` extra (which cannot be
# installed with rowgrove's own dependencies for the same reason: `pip install 'rowgrove[verl]'`
# does not resolve; this script is how the extra is installed).
#
# torch is installed first, alone and pinned (2.13.0, the CPU build in the local wheel folder), and
# pinned again in verl's resolve, so pip never reaches for a CUDA torch.
#
# Idempotent: a finished install leaves .venv-verl/.installed holding the pins below; when the
# stamp matches, the script returns at once. Usage: scripts/install_verl_env.sh [VENV_DIR]
set -euo pipefail

TORCH_VERSION="2.13.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${ROOT}/.venv-verl}"
PYTHON="${PYTHON:-python3}"
# The pins: the `verl` extra of pyproject.toml (verl and what its trainer imports undeclared), and
# rowgrove's own pin of the OpenAI SDK (the "rowgrove" agent loop's agents are OpenAI clients).
mapfile -t PINS < <("${PYTHON}" - "${ROOT}/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["optional-dependencies"]["verl"]))
print(next(d for d in project["dependencies"] if d.startswith("openai==")))
PY
)
STAMP="${VENV}/.installed"
WANT="torch==${TORCH_VERSION} ${PINS[*]} install_verl_env v3"

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
"${PIP[@]}" install "torch==${TORCH_VERSION}" "${PINS[@]}"
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
