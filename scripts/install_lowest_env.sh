#!/usr/bin/env bash
# One environment with the LOWEST version each of pyproject.toml's ranges allows (core and `dev`):
# the job that proves a range's lower end, `make test` runs the core suites (algo, ledger, gateway
# with real templates, assemble) in it and prints these versions. Every `name>=X` of the core and
# of `dev` becomes `name==X` (tomllib + packaging, below); what they pull in resolves as pip chooses,
# and is then kept in locks/lowest.txt like the other environments' locks (RELOCK=1 rewrites it).
# Idempotent (stamp VENV/.installed). Usage: scripts/install_lowest_env.sh [VENV_DIR]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env_lib.sh"
env_begin install_lowest_env "${1:-${ROOT}/.venv-stack-lowest}" "${ROOT}/locks/lowest.txt" || exit 0

FLOORS="${VENV}/floors.txt"
"${VENV}/bin/python" - "${ROOT}/pyproject.toml" "${FLOORS}" <<'PY'
import re
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
floors = []
for req in [*project["dependencies"], *project["optional-dependencies"]["dev"]]:
    name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
    low = re.search(r">=\s*([^,;\s]+)", req)
    if low is None:
        sys.exit(f"install_lowest_env: {req!r} has no lower end (>=): every range must have one")
    floors.append(f"{name}=={low.group(1)}")
open(sys.argv[2], "w").write("\n".join(floors) + "\n")
PY
# the floors are requirements (every one installed at exactly its lower end); torch at the CPU build
sed -i "s/^torch==.*/torch==${TORCH_VERSION}/" "${FLOORS}"
env_pip -r "${FLOORS}" -e "${ROOT}[dev]"
env_lock "the lower end of every range in pyproject.toml (core and dev): ${VENV##*/}/floors.txt"

"${VENV}/bin/python" - <<'PY'
import rowgrove.gateway  # noqa: F401
import rowgrove.ledger  # noqa: F401
PY
env_done
