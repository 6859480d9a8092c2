"""The planner's CPU prediction against peak RSS measured on real 2-rank runs (the planner's other checks, in one
process: tests/lib/test_plan.py)."""

from __future__ import annotations

import pytest

from fsdp_tune.planner.plan import memory_plan
from fsdp_tune.validate import check
from tests.conftest import FIXTURES
from tests.dist.conftest import MEASURED, REFERENCE


def _predicted_mib(*flags: str) -> float:
    cfg = check(str(FIXTURES / "tiny_lora.yaml"), list(flags)).config
    return memory_plan(cfg, on_cpu=True)["per_rank_host_peak_gib"] * 1024


def test_cpu_prediction_matches_measured_rss(reference_run, continued) -> None:
    """The demo-sized model (the reference run: the base config on 2 CPU ranks, 6 steps with sharded checkpoints;
    a launch of its own would measure the same model, batch and ranks) and a 125M-parameter one (the first run of
    the `continued` launch: its ranks' peak RSS is theirs alone, as in a launch of its own): predicted peak RSS
    within 20%."""
    assert next(iter(continued.members)) == "measured"  # a later run would report the process's earlier peaks
    runs = {REFERENCE: reference_run, MEASURED: continued["measured"]}
    for flags, run in runs.items():
        predicted = _predicted_mib(*flags)
        for rank in run.summary["per_rank"]:
            assert rank["peak_rss_mib"] == pytest.approx(predicted, rel=0.20), (flags, predicted, run.summary)
