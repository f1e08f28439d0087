# The two commands a new user needs: `make demo` and `make test`. Each creates .venv on first use,
# with the `dev`, `frameworks` and `ray` extras (the agent frameworks tests/frameworks drives through the
# gateway; Ray for tests/scale), and reinstalls when pyproject.toml changes.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,frameworks,ray]'
	touch $(STAMP)

.PHONY: demo test bench install
install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rowgrove demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/rowgrove bench
