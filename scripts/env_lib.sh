# Shared by scripts/install_{main,vllm,verl,lowest}_env.sh (sourced, not run): one environment,
# rowgrove installed into it editable WITH its dependencies (pyproject.toml's ranges), the exact
# versions taken from a lock in locks/ so every build resolves the same.
#
#   env_begin NAME VENV LOCK   make the venv unless its stamp says it is built (then returns 1)
#   env_pip ARGS...            install ARGS, constrained by the lock (RELOCK=1: not constrained)
#   env_lock "how"             RELOCK=1: write the lock from what got installed (scripts/lock_env.sh)
#   env_done                   write the stamp
#
# Installs go through uv (PyPI `uv`, pinned below, bootstrapped once into .venv-uv): building the
# main environment from its lock took 54 s with uv against 515 s with pip on the same loaded 2-core
# machine (README, "Installing beside vLLM, verl or TRL"). uv does not read pip's configuration, so
# what pip is configured with here (find-links, extra indexes, constraints: `pip config list`,
# $PIP_FIND_LINKS) is handed to uv as flags, with pip's rule of taking the best version from any
# index: a machine with a local CPU torch wheel folder gets it from there with uv as with pip.
#
# RELOCK=1 resolves afresh from pyproject.toml's ranges (and the stack's own pins) and rewrites the
# lock: how a lock is refreshed, then committed. Without it a build that cannot satisfy the lock
# fails naming the conflict; it never silently resolves something else.
# torch: every install names torch==2.13.0 (and every lock torch==2.13.0+cpu), so the resolver takes
# the CPU build and never a CUDA torch of several GB.

TORCH_VERSION="2.13.0"
UV_VERSION="0.13.9"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
RELOCK="${RELOCK:-0}"
UV_HOME="${ROOT}/.venv-uv"
UV="${UV_HOME}/bin/uv"

# uv itself, once (flock: `make -j4 envs` runs four installs at once)
ensure_uv() {
    (
        flock 9
        if [[ "$("${UV}" --version 2>/dev/null)" != "uv ${UV_VERSION}"* ]]; then
            "${PYTHON}" -m venv "${UV_HOME}"
            "${UV_HOME}/bin/python" -m pip --disable-pip-version-check -q install "uv==${UV_VERSION}" 2>&1 \
                | { grep -v "is ignored: it is neither a file nor a directory" || true; }
        fi
    ) 9>"${UV_HOME}.lock"
    "${UV}" --version >/dev/null
}

# pip's configured sources and constraints, as uv flags (one per line)
uv_source_args() {
    "${PYTHON}" - <<'PY'
import os
import subprocess
import sys

out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf: dict[str, list[str]] = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    conf.setdefault(key.rsplit(".", 1)[-1], []).extend(value.strip("'\"").split())
conf.setdefault("find-links", []).extend(os.environ.get("PIP_FIND_LINKS", "").split())
flags = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
         "constraint": "--constraint"}
seen = set()
for key, flag in flags.items():
    for value in conf.get(key, []):
        if value and (key, value) not in seen and (key == "index-url" or not value.startswith("file://")
                                                   or os.path.isdir(value[len("file://"):])):
            seen.add((key, value))
            print(flag)
            print(value)
if conf.get("extra-index-url"):
    print("--index-strategy")
    print("unsafe-best-match")  # pip's rule: the best version from any index
PY
}

env_begin() {
    ENV_NAME="$1"; VENV="$2"; LOCK="$3"; STAMP="${VENV}/.installed"
    ENV_START=$(date +%s)
    WANT="${ENV_NAME} $(cat "${ROOT}/pyproject.toml" "${LOCK}" "${ROOT}/scripts/env_lib.sh" "$0" 2>/dev/null \
        | sha256sum | cut -c1-16)"
    if [[ "${RELOCK}" != 1 && -f "${STAMP}" && "$(cat "${STAMP}")" == "${WANT}" && -x "${VENV}/bin/python" ]]; then
        touch "${STAMP}"  # newer than its inputs again, so make sees the environment as built
        echo "${ENV_NAME}: ${VENV} is up to date"
        return 1
    fi
    rm -f "${STAMP}"
    ensure_uv
    mapfile -t UV_SRC < <(uv_source_args)
    # --seed: pip in the environment too, for whoever uses it by hand
    [[ -x "${VENV}/bin/python" ]] || "${UV}" venv -q --seed --python "${PYTHON}" "${VENV}"
    LOCK_ARGS=(--upgrade)  # RELOCK=1: a fresh resolution, not what the environment already holds
    if [[ "${RELOCK}" != 1 ]]; then
        [[ -f "${LOCK}" ]] || { echo "${ENV_NAME}: no lock ${LOCK}: run with RELOCK=1 to write it" >&2; exit 2; }
        LOCK_ARGS=(--constraint "${LOCK}")
    fi
    return 0
}

env_pip() {
    "${UV}" pip install -q --python "${VENV}/bin/python" "${UV_SRC[@]}" "${LOCK_ARGS[@]}" "$@"
}

env_lock() {
    if [[ "${RELOCK}" == 1 ]]; then
        bash "${ROOT}/scripts/lock_env.sh" "${VENV}" "${LOCK}" "$1"
        WANT="${ENV_NAME} $(cat "${ROOT}/pyproject.toml" "${LOCK}" "${ROOT}/scripts/env_lib.sh" "$0" \
            | sha256sum | cut -c1-16)"
    fi
}

env_done() {
    echo "${WANT}" > "${STAMP}"
    echo "${ENV_NAME}: done in $(( $(date +%s) - ENV_START )) s"
}
