# Each target creates .venv and installs into it when missing, so `make run` and `make test`
# are the only commands a new user types. constraints.txt pins the exact builds these machines
# need (torch 2.13.0, CPU); the package itself only states ranges.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet -c constraints.txt
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test bench compose-test install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The service alone: no test tools.
$(RUN_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e .
	touch $@

$(TEST_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP) -e '.[test]'
	touch $@

install: $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/poolwire serve

test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q

bench: $(TEST_STAMP)
	$(BIN)/python bench/throughput.py

# compose.yaml built and run for real (docs/DEPLOYMENT.md): needs root, and Debian's mirror the
# first time (the Docker engine, the base image); tests/compose/run.sh says what it does.
compose-test: $(RUN_STAMP)
	tests/compose/run.sh

clean:
	rm -rf $(VENV) .poolwire .pytest_cache
