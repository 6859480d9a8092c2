"""Where --report_to trackers put the run, read off transformers' callbacks by the ranks (worker/summary.py, which
imports torch: hence this layer)."""

from __future__ import annotations

from pathlib import Path


def test_the_summary_says_where_tracker_files_went(tmp_path) -> None:
    from types import SimpleNamespace

    from fsdp_tune.output.run import format_summary
    from fsdp_tune.summary import RankMemory, RunSummary
    from fsdp_tune.worker.summary import tracker_locations

    TensorBoardCallback = type("TensorBoardCallback", (), {"logging_dir": str(tmp_path / "runs" / "Dec01")})
    WandbCallback = type("WandbCallback", (), {"_wandb": SimpleNamespace(run=SimpleNamespace(url=None, dir="/w/r"))})
    callbacks = [TensorBoardCallback(), WandbCallback(), object()]
    where = tracker_locations(SimpleNamespace(callback_handler=SimpleNamespace(callbacks=callbacks)))
    assert where == {"tensorboard": str(tmp_path / "runs" / "Dec01"), "wandb": "/w/r"}
    summary = RunSummary(1, 1.0, 1.0, [1.0], 1.0, None, 1.0, 10, 10.0, [RankMemory(1.0)], {}, "out", True)
    text = format_summary(RunSummary(**{**summary.__dict__, "trackers": where}))
    assert f"tensorboard: {tmp_path / 'runs' / 'Dec01'}" in text and "wandb: /w/r" in text


def test_transformers_callbacks_keep_what_the_summary_reads() -> None:
    """tracker_locations reads attributes of transformers' callbacks; their source still has them."""
    import importlib.util

    spec = importlib.util.find_spec("transformers")
    source = (Path(list(spec.submodule_search_locations)[0]) / "integrations" / "integration_utils.py").read_text()
    for name, attribute in (
        ("TensorBoardCallback", "self.logging_dir"),
        ("WandbCallback", "self._wandb"),
        ("MLflowCallback", "self._ml_flow"),
    ):
        body = source.split(f"class {name}(", 1)[1].split("\nclass ", 1)[0]
        assert attribute in body, (name, attribute)
