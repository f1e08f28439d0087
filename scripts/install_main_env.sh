#!/usr/bin/env bash
# The project's main environment, .venv: rowgrove editable with the `dev`, `frameworks`, `ray` and
# `trl` extras (TRL shares it: its transformers range holds rowgrove's), at the exact versions of
# locks/main.txt (RELOCK=1 resolves afresh from the ranges and rewrites it). What `make demo` and
# `make test` use. Idempotent (stamp VENV/.installed). Usage: scripts/install_main_env.sh [VENV_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env_lib.sh"
env_begin install_main_env "${1:-${ROOT}/.venv}" "${ROOT}/locks/main.txt" || exit 0

env_pip "torch==${TORCH_VERSION}" -e "${ROOT}[dev,frameworks,ray,trl]"
env_lock "pip install -e '.[dev,frameworks,ray,trl]' torch==${TORCH_VERSION} (the main environment, .venv)"
"${VENV}/bin/python" -c "import importlib.metadata as md, torch; assert not torch.version.cuda, torch.__version__; \
print(f'install_main_env: trl {md.version(\"trl\")}, transformers {md.version(\"transformers\")}, torch {torch.__version__}')"
env_done
