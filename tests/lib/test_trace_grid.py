"""The analytic planner held to the trace (benchmarks/trace_grid.py): the plan's step peak within 5% of the traced
one. CI runs benchmarks.trace_grid.CI_CASES in one process (about two minutes on 2 cores); FSDP_TUNE_TRACE_GRID=full
runs the whole grid (84 cases, about 40 minutes; `python -m benchmarks trace` prints it as BENCHMARKS.md section 9's
table)."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import trace_grid

pytest.importorskip("torch")
pytestmark = pytest.mark.lib

CASES = trace_grid.grid() if os.environ.get("FSDP_TUNE_TRACE_GRID") == "full" else list(trace_grid.CI_CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_plan_is_within_5_percent_of_the_trace(case) -> None:
    """The step's peak (SFT's, and DPO's and KTO's with their no-grad forwards); and the step-time inputs:
    all-gather and reduce-scatter bytes within 2% (counted alike; 4% for the preference steps, see
    trace_grid.COMM_TOLERANCE), FLOPs within 10% (the plan counts the input embedding as a matmul and attention
    its own way)."""
    row = trace_grid.compare(case)
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
