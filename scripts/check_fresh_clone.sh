#!/usr/bin/env bash
# The README's `make test` on a fresh clone with nothing beside it: no ../shared, no
# $ROWGROVE_TEMPLATES, no real tokenizers ($ROWGROVE_TOKENIZERS is an empty folder). The full
# suite runs with the real templates (CI has them beside the clone) and tokenizers; this runs,
# once more and without them, every test module that uses files the repository does not ship, in
# a copy of this working tree placed where no ../shared exists. Each such test must skip
# through tests/realfiles.py (with the closing lines that count them), never error: a test that
# reads a template or a tokenizer directly fails here. Used by .ci/run after `make test`; about
# two minutes.
#
# Usage: scripts/check_fresh_clone.sh   (after `make envs`; uses this checkout's .venv)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${ROOT}/.venv/bin/python"
[[ -x "${PY}" ]] || { echo "check_fresh_clone: no ${ROOT}/.venv: run make envs first" >&2; exit 2; }

WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
CLONE="${WORK}/rowgrove"   # ${WORK}/shared does not exist
mkdir "${CLONE}"
NO_TOKENIZERS="${WORK}/no-tokenizers"   # what a machine without npm or network has
mkdir "${NO_TOKENIZERS}"
# the working tree as git sees it: tracked files and untracked ones git does not ignore
(cd "${ROOT}" && git ls-files -z --cached --others --exclude-standard) \
    | (cd "${ROOT}" && xargs -0 tar -cf - --ignore-failed-read 2>/dev/null) | tar -xf - -C "${CLONE}"

# The modules that use such files: those that name the helpers or the files, and every module of a
# folder whose conftest or helper does.
PATTERN='families|parser_templates|realfiles|ROWGROVE_TEMPLATES|ROWGROVE_TOKENIZERS|\.jinja|shared/'
mapfile -t MODULES < <(cd "${CLONE}" && {
    grep -rlE --include='test_*.py' "${PATTERN}" tests
    grep -rlE --include='*.py' --exclude='test_*.py' "${PATTERN}" tests \
        | grep -vE '^tests/(conftest|families|realfiles)\.py$' \
        | xargs -r -n1 dirname | sort -u | while read -r dir; do ls "${dir}"/test_*.py; done
} | sort -u)
echo "check_fresh_clone: ${#MODULES[@]} modules, without the templates and tokenizers, in ${CLONE}"

LOG="${WORK}/pytest.log"
status=0
(cd "${CLONE}" && env -u ROWGROVE_TEMPLATES ROWGROVE_VERL_PYTHON="${ROOT}/.venv-stack-verl/bin/python" ROWGROVE_VLLM_PYTHON="${ROOT}/.venv-stack-vllm/bin/python" ROWGROVE_TOKENIZERS="${NO_TOKENIZERS}" \
    ROWGROVE_REQUIRE_VLLM=1 ROWGROVE_REQUIRE_TRAINERS=1 \
    "${PY}" -m pytest -q -p no:rerunfailures -p no:randomly "${MODULES[@]}") 2>&1 | tee "${LOG}" \
    || status=$?
if [[ ${status} -ne 0 ]]; then
    echo "check_fresh_clone: FAILED (exit ${status}): a test that needs a real template or tokenizer must skip without it" >&2
    exit 1
fi
if ! grep -q "real-template tests skipped" "${LOG}"; then
    echo "check_fresh_clone: FAILED: no real-template skip line (did the modules find templates after all?)" >&2
    exit 1
fi
if ! grep -q "real-tokenizer tests skipped" "${LOG}"; then
    echo "check_fresh_clone: FAILED: no real-tokenizer skip line (did the modules find tokenizers after all?)" >&2
    exit 1
fi
echo "check_fresh_clone: passed"
