"""The planner's CPU prediction against peak RSS measured on real 2-rank runs (the planner's other checks, in one
process: tests/lib/test_plan.py)."""

from __future__ import annotations

import pytest

from fsdp_tune.planner.plan import memory_plan
from fsdp_tune.validate import check
from tests.conftest import FIXTURES


def test_cpu_prediction_matches_measured_rss(train, tmp_path) -> None:
    """The demo-sized model and a 125M-parameter one on 2 CPU ranks: predicted peak RSS within 20%."""
    for i, flags in enumerate(((), ("--model_name_or_path", "builtin:small-llama", "--max_seq_len", "128"))):
        cfg = check(str(FIXTURES / "tiny_lora.yaml"), list(flags)).config
        predicted = memory_plan(cfg, on_cpu=True)["per_rank_host_peak_gib"] * 1024
        run = train(*flags, "--max_steps", "2", output_dir=tmp_path / f"run{i}")
        for rank in run.summary["per_rank"]:
            assert rank["peak_rss_mib"] == pytest.approx(predicted, rel=0.20), (flags, predicted, run.summary)
