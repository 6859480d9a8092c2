# fsdp-tune: `make demo` sets up .venv and trains the CPU demo; `make test` sets up .venv and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c constraints.txt

.PHONY: setup demo test test-unit test-dist lint bench gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	@touch $@

demo: setup
	$(VENV)/bin/fsdp-tune train --config configs/demo_cpu.yaml

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q tests/unit

lint: setup
	$(VENV)/bin/ruff check fsdp_tune tests benchmarks scripts
	$(VENV)/bin/ruff format --check fsdp_tune tests benchmarks scripts

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
