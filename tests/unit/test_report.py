"""report: reads metrics back (resumed runs keep the last value per step), draws a PNG, compares runs."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.tools.report import load_metrics, series


def _run(tmp_path, name, losses, eval_at=()):
    d = tmp_path / name
    d.mkdir()
    with open(d / "metrics.jsonl", "w") as f:
        for i, loss in enumerate(losses, 1):
            f.write(json.dumps({"step": i, "loss": loss, "learning_rate": 0.1 / i}) + "\n")
            if i in eval_at:
                f.write(json.dumps({"step": i, "eval_loss": loss + 0.1}) + "\n")
    return d


def test_series_keeps_last_value_of_repeated_steps(tmp_path) -> None:
    d = _run(tmp_path, "a", [3.0, 2.0, 1.5])
    with open(d / "metrics.jsonl", "a") as f:  # a resumed run logs step 3 again
        f.write(json.dumps({"step": 3, "loss": 1.4}) + "\n")
    assert series(load_metrics(d), "loss") == ([1, 2, 3], [3.0, 2.0, 1.4])


def test_report_draws_one_figure_for_several_runs(tmp_path) -> None:
    a = _run(tmp_path, "a", [3.0, 2.0, 1.0], eval_at=(3,))
    b = _run(tmp_path, "b", [3.5, 2.5])
    out = tmp_path / "cmp.png"
    r = CliRunner().invoke(app, ["report", str(a), str(b), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:4] == b"\x89PNG"
    from fsdp_tune.tools.report import summary_rows

    rows = summary_rows([a, b])
    assert [(r["steps"], r["loss_last"], r["eval_loss_last"], r["status"]) for r in rows] == [
        (3, 1.0, 1.1, "incomplete"),
        (2, 2.5, None, "incomplete"),
    ]
    line_a = next(line for line in r.output.splitlines() if line.startswith(str(a)[-40:]))
    assert line_a.split()[1:5] == ["incomplete", "3", "1.0000", "1.1000"]


def test_report_without_metrics(tmp_path) -> None:
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "no metrics.jsonl" in r.output
