#!/usr/bin/env bash
# One-shot GPU check (LoRA + QLoRA, FSDP2, 1 GPU, bf16, seq 2048, an 8B-class Llama with random weights):
# tokens/s, MFU, peak memory next to `fsdp-tune plan`. Under 8 minutes on an H100/H200.
#   scripts/gpu_check.sh               on a GPU machine
#   scripts/gpu_check.sh --cpu-smoke   the same path end to end on CPU with a tiny model
# Offline machines: put the wheels in ../wheels (or WHEELS_DIR) and the set-up installs from there only.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS_DIR=${WHEELS_DIR:-../wheels}
if [ ! -x .venv/bin/fsdp-tune ]; then
  python3 -m venv .venv
  if [ -d "$WHEELS_DIR" ]; then
    .venv/bin/python -m pip install -q --no-index --find-links "$WHEELS_DIR" -c constraints.txt torch==2.13.0
    .venv/bin/python -m pip install -q --no-index --find-links "$WHEELS_DIR" -c constraints.txt -e .
  else
    .venv/bin/python -m pip install -q -c constraints.txt torch==2.13.0
    .venv/bin/python -m pip install -q -c constraints.txt -e .
  fi
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
exec .venv/bin/python -m benchmarks.gpu_check "$@"
