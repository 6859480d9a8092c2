# fsdp-tune: `make demo` sets up .venv and trains the CPU demo; `make test` sets up .venv and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q -c constraints.txt

.PHONY: setup demo test test-low test-unit test-lib test-dist test-gpu lint bench gpu-check gpu-wheels clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[dev]"
	@touch $@

# The lowest supported set (constraints-low.txt; fsdp_tune/sources/versions.py RANGES), for the version-specific
# tests (test-low). A venv layered on .venv: its own site-packages holds only the pins that differ from
# constraints.txt (transformers 5.17 and the huggingface_hub, tokenizers, httpx it needs), first on the path, and a
# .pth adds .venv's site-packages (torch, PEFT, TRL, accelerate, fsdp-tune editable: the same pins in both files)
# after them; ~15 s instead of a second torch install (~60 s). Without a pip of its own (--without-pip: ensurepip
# costs ~4 CPU-s, 5-15 s on 2 busy cores): `python -m pip` there is .venv's pip (the same pip, through the .pth),
# run by .venv-low's interpreter, so it installs into .venv-low. `make test-low` prints what it imports.
VENV_LOW := .venv-low
PY_LOW := $(VENV_LOW)/bin/python
LOW_ONLY = $(shell grep -vxFf constraints.txt constraints-low.txt | grep -v '^\#')

$(VENV_LOW)/.installed: $(VENV)/.installed constraints-low.txt
	rm -rf $(VENV_LOW) && $(PYTHON) -m venv --without-pip $(VENV_LOW)
	echo "import site; site.addsitedir('$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
	  > "$$($(PY_LOW) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/zz_fsdp_tune_base.pth"
	$(PY_LOW) -m pip install -q -c constraints-low.txt $(LOW_ONLY) 2>&1 | grep -v "^Not uninstalling\|^Can't uninstall\|outside environment" || true
	@touch $@

demo: setup
	$(VENV)/bin/fsdp-tune train --config configs/demo_cpu.yaml

# every layer (CI runs this), in TEST_WORKERS processes at once (tests/workers.py: the units of work); each layer
# alone below (tests/conftest.py says what each runs)
# First the checkout's bytecode, once: where PYTHONDONTWRITEBYTECODE is set (as on the machines here), every process
# (each rank, launcher and CLI call) would compile the fsdp_tune modules it imports from source again (~0.12 CPU-s a
# rank); existing .pyc files are still read, and checked against their source's mtime. Elsewhere Python writes them
# itself on the first import and this costs nothing.
TEST_WORKERS ?= 2
test: setup $(VENV_LOW)/.installed
	$(PY) -m compileall -q -x '/fixtures/' fsdp_tune tests benchmarks
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
	@$(MAKE) --no-print-directory test-low

# the version-specific tests again on the lowest supported set (.venv-low above): vision (the collator's
# mm_token_type_ids, M-RoPE positions, the 2-rank launch of every family), GRPO's launch (LoRA, QLoRA, a resume,
# the self-check), the CPU shim, and the versions `env` reads; first, each library as the venv imports it against
# constraints-low.txt (a stale .venv-low is an error, not a pass on the wrong set)
LOW_TESTS := tests/lib/test_vision_pieces.py tests/lib/test_env.py \
  tests/lib/test_worker_pieces.py::test_shim_turns_cpu_fsdp_plugin_into_fsdp_state tests/dist/test_vision.py \
  tests/dist/test_grpo.py::test_grpo_lora_qlora_resume_and_the_self_check_in_one_launch
test-low: $(VENV_LOW)/.installed
	@$(PY_LOW) -m fsdp_tune.sources.versions constraints-low.txt
	HF_HUB_OFFLINE=1 $(PY_LOW) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -p no:cacheprovider \
	  $(LOW_TESTS)

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

# The GPU check's wheels (scripts/gpu_check.sh; DESIGN.md "Benchmarks and the GPU check"): what the lent GPU
# machine's image lacks (trl, datasets, bitsandbytes, dill, multiprocess) and peft (the image's version is not known;
# 0.5 MB, so the peft that runs is constraints.txt's), at constraints.txt's versions, for CPython $(PY_TARGET)
# manylinux x86_64, into the git-ignored $(WHEELS_DIR)/; then the total, beside the tracked tree (both must stay under
# 60 MiB: the device tool carries 64 MiB). transformers is NOT carried: fsdp-tune runs with the image's 5.17.0 (the
# CPU rehearsal with 5.17.0 passes, DESIGN.md), and 5.24 would add 13.5 MB to the ~46 MB these take (bitsandbytes
# alone is 43 MB). The other packages these need are in the image (numpy, pyarrow, pandas, fsspec, xxhash,
# huggingface_hub, jinja2, psutil, ...).
# `make gpu-wheels PY_TARGET=3.11 WHEELS_DIR=.whl-3.11`: the same for the CPU rehearsal's Python 3.11 venv.
PY_TARGET ?= 3.12
WHEELS_DIR ?= .whl
GPU_WHEELS := trl peft datasets bitsandbytes dill multiprocess
GPU_PLATFORMS := $(foreach n,2_28 2_27 2_24 2_17,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64

gpu-wheels:
	rm -rf $(WHEELS_DIR) && mkdir -p $(WHEELS_DIR)
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --implementation cp --python-version $(PY_TARGET) \
	  $(GPU_PLATFORMS) -d $(WHEELS_DIR) \
	  $(foreach w,$(GPU_WHEELS),$(shell grep -i '^$(w)==' constraints.txt))
	@ls -1 $(WHEELS_DIR)
	@wheels=$$(du -cb $(WHEELS_DIR)/*.whl | tail -1 | cut -f1); \
	tree=$$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1); \
	total=$$((wheels + tree)); \
	echo "wheels: $$((wheels / 1024)) KiB; tracked tree: $$((tree / 1024)) KiB; together $$((total / 1048576)) MiB (limit 60 MiB)"; \
	test $$total -lt $$((60 * 1048576)) || { echo "error: tree + wheels over 60 MiB: the device tool would refuse them"; exit 1; }

clean:
	rm -rf $(VENV) $(VENV_LOW) build *.egg-info
