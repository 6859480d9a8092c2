#!/usr/bin/env bash
# The GPU check: every GPU path fsdp-tune decides by reading the libraries, run for a few steps on this machine
# (LoRA/QLoRA x FSDP2/FSDP1 x cpu_offload, QLoRA storage under another precision, HSDP and context parallelism
# when there are GPUs enough, a CPU run on a GPU machine), each ending with the adapter check; tokens/s, MFU and
# peak memory next to `fsdp-tune plan`. About 6-8 minutes on one H100/H200.
#   scripts/gpu_check.sh               on a GPU machine
#   scripts/gpu_check.sh --cpu-smoke   the same path on CPU with the tiny model (CI runs this)
#
# Offline machines: nothing is installed into the machine. fsdp-tune runs from this checkout (no pip install,
# so no setuptools is needed). Packages the machine lacks travel as wheels in $WHEELS_DIR (default .whl/),
# unpacked into a private folder first on the path. For the full check, beside the machine's CUDA torch:
#   transformers==5.24.0 accelerate==1.15.0 peft==0.21.2 trl==1.16.0 bitsandbytes==0.50.2 datasets==5.2.0
#   typer==0.16.1 click shellingham pyyaml safetensors tokenizers huggingface_hub
#   and datasets' own needs: pyarrow dill multiprocess xxhash fsspec pandas
# (constraints.txt has the versions). Without trl or datasets the training scenarios are skipped by name and
# benchmarks/gpu_paths.py still checks the decisions underneath with torch, transformers, PEFT and accelerate;
# without bitsandbytes the QLoRA scenarios are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
WHEELS_DIR=${WHEELS_DIR:-.whl}
if compgen -G "$WHEELS_DIR/*.whl" > /dev/null; then
  SITE=${TMPDIR:-/tmp}/fsdp-tune-site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS_DIR"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # fsdp-tune from this checkout, installed or not
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ "${1:-}" != "--cpu-smoke" ]; then
  if ! "$PY" - <<'PY'
import sys
try:
    import torch
except ImportError:
    sys.exit("error: torch is not installed: the GPU check needs a CUDA build of torch (2.6 or newer)")
if torch.version.cuda is None:
    sys.exit(f"error: torch {torch.__version__} is a CPU build: the GPU check needs a CUDA build "
             "(pip install torch==2.13.0 from the CUDA index, or the machine's own); --cpu-smoke runs on CPU")
if not torch.cuda.is_available():
    sys.exit("error: torch is a CUDA build but sees no GPU (check CUDA_VISIBLE_DEVICES and the driver)")
PY
  then exit 2; fi
fi
exec "$PY" -m benchmarks.gpu_check "$@"
