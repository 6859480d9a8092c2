"""Rank 0's console pieces, in one process: the progress line's two forms (a terminal: redrawn in place; a file:
plain lines), and the dtype `merge` keeps a base in. The run as people see it: tests/dist/test_console.py."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace


def _state(step: int, total: int = 10) -> SimpleNamespace:
    return SimpleNamespace(is_world_process_zero=True, global_step=step, max_steps=total)


def _drive(live: bool, monkeypatch) -> str:
    """Ten steps with a log at every other one, through ProgressCallback, onto a console in memory."""
    from fsdp_tune.config.methods import ROWS
    from fsdp_tune.worker import logs
    from fsdp_tune.worker.phases import Phases
    from fsdp_tune.worker.training import progress

    out = io.StringIO()
    monkeypatch.setattr(logs, "_console", logs.Console(out, out, None, live=live))
    clock = iter(range(1000))
    monkeypatch.setattr(progress.time, "time", lambda: float(next(clock)) * 3)  # 3 s per call
    cb = progress.ProgressCallback("cpu", 2, Phases(0.0), live, ROWS["sft"].eval_metrics)
    cb.on_train_begin(None, _state(0), None)
    for step in range(1, 11):
        cb.on_step_end(None, _state(step), None)
        if step % 2 == 0:
            logs_ = {"loss": 5.0 - step / 10, "learning_rate": 1e-3, "num_tokens": 1000.0 * step}
            cb.on_log(None, _state(step), None, logs=logs_)
    cb.on_evaluate(None, _state(10), None, metrics={"eval_loss": 4.2, "eval_runtime": 0.5})
    cb.on_train_end(None, _state(10), None)
    return out.getvalue()


def test_progress_is_redrawn_on_a_terminal_and_plain_lines_elsewhere(monkeypatch) -> None:
    plain = _drive(False, monkeypatch)
    assert "\r" not in plain
    steps = [line for line in plain.splitlines() if line.startswith("step ")]
    # at most one line per LINES_EVERY_S (10 s; the fake clock moves 3 s a call), and the last step's
    assert [s.split()[1] for s in steps] == ["2/10", "6/10", "10/10"], plain
    assert steps[0].startswith("step 2/10  loss 4.800  lr 1.0e-03  ") and "tokens/s  ETA " in steps[0]
    assert "ETA" not in steps[-1] and "MiB RSS" in steps[-1]
    assert "eval (step 10)" in plain and "loss 4.2000" in plain

    live = _drive(True, monkeypatch)
    assert live.count("\rstep ") >= 5 and live.endswith("\n")
    assert "\rstep 10/10  loss 4.000" in live


def test_the_base_dtype_comes_from_config_else_its_weights(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    from fsdp_tune.tools.merge import own_dtype

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))  # no dtype recorded
    save_file(
        {"a": torch.zeros(2, dtype=torch.bfloat16), "b": torch.zeros(2, dtype=torch.bfloat16)},
        tmp_path / "m.safetensors",
    )
    assert own_dtype(str(tmp_path)) == ("bfloat16", "the base's own, from its safetensors weights")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "float16"}))
    assert own_dtype(str(tmp_path)) == ("float16", "the base's own, from config.json")
