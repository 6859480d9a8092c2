"""The analytic planner held to the trace (benchmarks/trace_grid.py): the plan's step peak within 5% of the traced
one. CI runs benchmarks.trace_grid.CI_CASES (about two minutes on 2 cores); FSDP_TUNE_TRACE_GRID=full runs the
whole grid (84 cases, about 40 minutes; `python -m benchmarks trace` prints it as BENCHMARKS.md section 9's table).

Each case runs in a process of its own, as `plan --trace` does (one command, one trace): after other traces in the
same process, CI once traced the 405B case as if sharded over 4 ranks instead of 512 (210.7 GiB; its plan at 4
ranks: 211.1 GiB), and the case failed once in 12 local runs of test_trace.py and two grid cases in one process
(that output was not kept); the leak is not found yet (see trace/build.py check_sharding)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from benchmarks import trace_grid
from tests.conftest import REPO

ROW = (
    "import json, sys; from benchmarks import trace_grid; "
    "print(json.dumps(trace_grid.compare(trace_grid.Case(*json.loads(sys.argv[1])))))"
)


def compare_alone(case: trace_grid.Case) -> dict:
    """trace_grid.compare(case) in a fresh process; its JSON row."""
    fields = json.dumps(dataclasses.astuple(case))  # Case's own field order, whatever fields it gains
    proc = subprocess.run([sys.executable, "-c", ROW, fields], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


pytest.importorskip("torch")
pytestmark = pytest.mark.lib

CASES = trace_grid.grid() if os.environ.get("FSDP_TUNE_TRACE_GRID") == "full" else list(trace_grid.CI_CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plan_is_within_5_percent_of_the_trace(case) -> None:
    """The step's peak (SFT's, and DPO's and KTO's with their no-grad forwards); and the step-time inputs:
    all-gather and reduce-scatter bytes within 2% (counted alike; 4% for the preference steps, see
    trace_grid.COMM_TOLERANCE), FLOPs within 10% (the plan counts the input embedding as a matmul and attention
    its own way)."""
    row = compare_alone(case)
    shown = json.dumps(row, indent=1)  # every key and phase (pytest would shorten the dict)
    assert row["trace_world_size"] == case.world, shown
    assert abs(row["error"]) <= trace_grid.TOLERANCE, shown
    assert row["plan_comm_gb"] == pytest.approx(row["trace_comm_gb"], rel=trace_grid.COMM_TOLERANCE[case.method]), shown
    assert row["plan_tflops"] == pytest.approx(row["trace_tflops"], rel=0.10), shown


def test_the_ci_subset_covers_every_axis_and_every_place_the_peak_sits() -> None:
    ci = trace_grid.CI_CASES
    assert {c.model for c in ci} == set(trace_grid.MODELS) and {c.world for c in ci} == set(trace_grid.WORLDS)
    assert {c.qlora for c in ci} == {True, False} and {c.batch for c in ci} == set(trace_grid.BATCHES)
    assert any(c.offload for c in ci) and any(c.hsdp for c in ci)
    assert {c.method for c in ci} == {"sft", "dpo", "kto"}
