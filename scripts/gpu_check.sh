#!/usr/bin/env bash
# The GPU check (issues #21, #31): every GPU path fsdp-tune decides by reading the libraries, run for a few steps on
# a lent GPU machine in the order of what a GPU minute answers (a probe of the device first, the library paths,
# the seed's flagship path, the 8B throughput run, ...), inside a budget (7 minutes on one H200), each scenario
# judged by checks that can fail (benchmarks/gpu_criteria.py). DESIGN.md "Benchmarks and the GPU check" has the
# exact device call and the CPU rehearsal.
#   OUT=DIR scripts/gpu_check.sh               on a GPU machine (results in DIR; else --out DIR, else
#                                              benchmarks/results/gpu_check/)
#   OUT=DIR scripts/gpu_check.sh --cpu-smoke   the same path on CPU with the tiny model (CI runs a part of it)
#   ... --only NAME,NAME                       only the scenarios whose names contain one of these
#   python -m benchmarks.gpu_verdict DIR       the verdict table from DIR, afterwards
#
# The budget plan is printed first, before the wheels. Nothing is installed into the machine: fsdp-tune runs from
# this checkout, and the wheels `make gpu-wheels` put in .whl/ (WHEELS_DIR: what the machine's image lacks, and
# peft) are unpacked into a private folder first on the path. PY=python (default: .venv/bin/python when there is
# one, else python3). Files in the output folder, written as the check goes: gpu_check.log, probe.json,
# scenarios.jsonl, summary.json, failures.log (benchmarks/gpu_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_CHECK_STARTED=$(date +%s)
export GPU_CHECK_STARTED
cpu_smoke=0
out_dir=${OUT:-}
prev=
for arg in "$@"; do
  [ "$arg" = "--cpu-smoke" ] && cpu_smoke=1
  [ "$prev" = "--out" ] && out_dir=$arg
  prev=$arg
done
[ -n "$out_dir" ] || out_dir=benchmarks/results/gpu_check$([ $cpu_smoke = 1 ] && echo _cpu_smoke)
mkdir -p "$out_dir" || exit 2
log=$out_dir/gpu_check.log
: > "$log"
say() { echo "$*" | tee -a "$log"; }
if [ $cpu_smoke = 1 ]; then budget=${GPU_CHECK_BUDGET_S:-3600}; else budget=${GPU_CHECK_BUDGET_S:-450}; fi
say "GPU check$([ $cpu_smoke = 1 ] && echo ' (--cpu-smoke)'): time budget ${budget} s in all (wheels, probe, models, scenarios); results in $out_dir"

if [ -z "${PY:-}" ]; then
  PY=python3
  [ -x .venv/bin/python ] && PY=.venv/bin/python
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" GPU_CHECK_BUDGET_S=$budget  # fsdp-tune from this checkout
# the plan first: no torch, no wheels needed (benchmarks/gpu_budget.py)
"$PY" -m benchmarks.gpu_check "$@" --plan-only --out "$out_dir" && export GPU_CHECK_PLANNED=1
WHEELS_DIR=${WHEELS_DIR:-.whl}
if compgen -G "$WHEELS_DIR/*.whl" > /dev/null; then
  site=${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/fsdp-tune-site}
  rm -rf "$site"
  t=$(date +%s)
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$WHEELS_DIR"/*.whl >> "$log" 2>&1; then
    say "error: the wheels in $WHEELS_DIR did not install into $site (pip's words above, in $log)"
    exit 2
  fi
  GPU_CHECK_WHEELS_S=$(($(date +%s) - t))
  say "installed $(ls "$WHEELS_DIR"/*.whl | wc -l) wheels from $WHEELS_DIR into $site in $GPU_CHECK_WHEELS_S s: $(cd "$WHEELS_DIR" && ls *.whl | tr '\n' ' ')"
  export PYTHONPATH="$PWD:$site${PYTHONPATH#$PWD}" GPU_CHECK_SITE=$site GPU_CHECK_WHEELS_S
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" -m benchmarks.gpu_check "$@" --out "$out_dir"
