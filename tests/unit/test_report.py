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


def test_the_figure_has_each_runs_loss_curve_and_eval_points(tmp_path) -> None:
    """What `report` draws, read off the figure: per run a training-loss line with every logged step, its eval
    points dashed in the same colour, its learning rate below; runs that share a folder name keep apart."""
    from fsdp_tune.tools.report import figure

    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a = _run(tmp_path / "x", "out", [3.0, 2.0, 1.0, 0.5], eval_at=(2, 4))
    b = _run(tmp_path / "y", "out", [3.5, 2.5])
    c = _run(tmp_path, "c", [4.0, 3.0, 2.0])
    ax_loss, ax_lr = figure([a, b, c]).axes
    lines = {line.get_label(): line for line in ax_loss.get_lines()}
    assert set(lines) == {f"{a} train", f"{a} eval", f"{b} train", "c train"}
    assert list(lines[f"{a} train"].get_xdata()) == [1, 2, 3, 4]
    assert list(lines[f"{a} train"].get_ydata()) == [3.0, 2.0, 1.0, 0.5]
    assert list(lines[f"{a} eval"].get_xdata()) == [2, 4] and lines[f"{a} eval"].get_linestyle() == "--"
    assert list(lines[f"{a} eval"].get_ydata()) == [2.1, 0.6]
    assert list(lines["c train"].get_ydata()) == [4.0, 3.0, 2.0]
    assert lines[f"{a} train"].get_color() == lines[f"{a} eval"].get_color() != lines[f"{b} train"].get_color()
    assert [line.get_label() for line in ax_lr.get_lines()] == [str(a), str(b), "c"]


def test_report_without_metrics(tmp_path) -> None:
    r = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert r.exit_code == 2 and "no metrics.jsonl" in r.output


def test_a_preference_runs_own_metrics_are_printed_and_plotted(tmp_path) -> None:
    """A DPO run (its summary says so) beside an SFT run: its reward accuracy and margin in the table, and two
    panels for them in the figure, with the DPO run's lines."""
    from fsdp_tune.output.tables import format_rows
    from fsdp_tune.tools.report import figure, summary_rows

    sft = _run(tmp_path, "sft", [3.0, 2.0])
    dpo = _run(tmp_path, "dpo", [0.69, 0.3])
    with open(dpo / "metrics.jsonl", "a") as f:
        for step, (acc, margin) in enumerate(((0.5, 0.1), (1.0, 2.5)), 1):
            f.write(json.dumps({"step": step, "rewards/accuracies": acc, "rewards/margins": margin}) + "\n")
    (dpo / "fsdp_tune_summary.json").write_text(
        json.dumps({"kind": "interrupted", "interrupted_at_step": 2, "checkpoint_saved": False})
    )
    (dpo / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": {"method": "dpo"}}))  # read for its method only
    rows = summary_rows([sft, dpo])
    assert [r["method"] for r in rows] == ["sft", "dpo"]
    table = format_rows(rows).splitlines()
    assert table[2].endswith("dpo: rewards/accuracies 1.000, rewards/margins 2.500") and "dpo:" not in table[1]
    axes = figure([sft, dpo]).axes
    assert len(axes) == 4 and [len(ax.lines) for ax in axes[1:3]] == [1, 1]
    assert axes[1].lines[0].get_ydata().tolist() == [0.5, 1.0] and axes[2].get_ylabel() == "reward margin"


def test_a_grpo_runs_reward_each_functions_length_and_kl_are_plotted(tmp_path) -> None:
    """GRPO: the reward with each function's mean beside it (dotted), the completion length and the KL, a panel
    each; the table's two columns are the reward and the length."""
    from fsdp_tune.output.tables import format_rows
    from fsdp_tune.tools.report import figure, summary_rows

    run = _run(tmp_path, "grpo", [0.0, 0.1])
    with open(run / "metrics.jsonl", "a") as f:
        for step, (reward, kl) in enumerate(((0.2, 0.0), (0.6, 0.02)), 1):
            record = {"step": step, "reward": reward, "completions/mean_length": 20 - step, "kl": kl}
            f.write(json.dumps({**record, "rewards/exact/mean": reward / 2, "rewards/exact/std": 0.1}) + "\n")
    (run / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": {"method": "grpo"}}))
    axes = figure([run]).axes
    assert [ax.get_ylabel() for ax in axes] == ["loss", "reward", "completion length", "KL", "learning rate"]
    assert [line.get_label() for line in axes[1].lines] == ["grpo", "grpo exact"]
    assert axes[1].lines[1].get_ydata().tolist() == [0.1, 0.3] and axes[3].lines[0].get_ydata().tolist() == [0.0, 0.02]
    assert (
        format_rows(summary_rows([run])).splitlines()[1].endswith("grpo: reward 0.600, completions/mean_length 18.000")
    )
