#!/usr/bin/env bash
# Write an environment's exact versions as a lock (a pip constraints file) that `make` installs from.
# Usage: scripts/lock_env.sh VENV_DIR LOCK_FILE "how the environment was resolved (one line)"
# rowgrove itself (editable) and the metadata-only `vllm` alias of scripts/install_vllm_env.sh are
# left out: the first is this checkout, the second is written by the script, not installed by pip.
set -euo pipefail
VENV="$1"; LOCK="$2"; HOW="$3"
UV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-uv/bin/uv"   # scripts/env_lib.sh installs it
{
    echo "# Exact versions of $(basename "${LOCK}" .txt)'s environment, written by scripts/lock_env.sh from"
    echo "# ${HOW}"
    echo "# Used as pip constraints (-c): pip still checks them against pyproject.toml's ranges."
    echo "# Python $("${VENV}/bin/python" -c 'import platform; print(platform.python_version())'), $(date -u +%Y-%m-%d)."
    "${UV}" pip freeze --python "${VENV}/bin/python" 2>/dev/null \
        | grep -vE '^(-e |#|rowgrove==|pip==|setuptools==|wheel==)' \
        | grep -vE '^vllm==.*\+cpu$' \
        | LC_ALL=C sort -f
} > "${LOCK}.tmp"
mv "${LOCK}.tmp" "${LOCK}"
echo "lock_env: $(grep -vc '^#' "${LOCK}") packages -> ${LOCK}"
