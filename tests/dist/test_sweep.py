"""The combination sweep in its bounded form (`python -m benchmarks sweep --ci`): every row expected to be
refused is refused with its rule id, and the rows marked for CI train to the end with a whole adapter.
The full sweep (`python -m benchmarks sweep`, a few minutes a row) and its last result: BENCHMARKS.md."""

from __future__ import annotations

from benchmarks import sweep


def test_bounded_sweep(model_cache, monkeypatch) -> None:
    monkeypatch.setenv("FSDP_TUNE_CACHE", str(model_cache))
    outcomes = sweep.run(ci=True)
    assert {o.status for o in outcomes} <= {"trained", "refused"}, sweep.as_markdown(outcomes)
    assert len([o for o in outcomes if o.status == "trained"]) == len([r for r in sweep.ROWS if r.ci])
