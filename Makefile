# fsdp-tune: `make demo` sets up .venv and trains the CPU demo; `make test` sets up .venv and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c constraints.txt

.PHONY: setup demo test test-unit test-lib test-dist test-gpu lint bench gpu-check clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	@touch $@

demo: setup
	$(VENV)/bin/fsdp-tune train --config configs/demo_cpu.yaml

# every layer (CI runs this); each layer alone below (tests/conftest.py says what each runs)
test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q

test-unit: setup  # no torch, no processes: seconds
	$(PY) -m pytest -q tests/unit

test-lib: setup  # one process with torch, transformers, PEFT, TRL
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/lib

test-dist: setup  # real multi-process runs through torchrun on CPU: minutes
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/dist

test-gpu: setup  # needs CUDA (skipped without it)
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -rs tests/gpu

lint: setup
	$(VENV)/bin/ruff check fsdp_tune tests benchmarks scripts
	$(VENV)/bin/ruff format --check fsdp_tune tests benchmarks scripts

bench: setup
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
