"""Read a run's metrics back, print the summary table, draw loss.png (several runs on one figure)."""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_tune.worker_paths import SUMMARY_NAME


def load_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; a resumed run's repeated steps keep their last value."""
    by_step: dict[int, float] = {}
    for r in records:
        if key in r and r[key] is not None:
            by_step[int(r["step"])] = float(r[key])
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def plot(run_dirs: list[str | Path], out: str | Path) -> Path:
    # matplotlib's object API without pyplot: half the import time, and no GUI backend is ever touched
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6))
    FigureCanvasAgg(fig)
    ax_loss, ax_lr = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for run_dir in run_dirs:
        records = load_metrics(run_dir)
        label = Path(run_dir).name
        steps, loss = series(records, "loss")
        ax_loss.plot(steps, loss, marker="." if len(steps) < 50 else None, label=f"{label} train")
        e_steps, e_loss = series(records, "eval_loss")
        if e_steps:
            ax_loss.plot(e_steps, e_loss, marker="o", linestyle="--", label=f"{label} eval")
        lr_steps, lr = series(records, "learning_rate")
        ax_lr.plot(lr_steps, lr, label=label)
    ax_loss.set_ylabel("loss")
    ax_loss.legend(fontsize="small")
    ax_loss.grid(alpha=0.3)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=100)
    return out


def summary_rows(run_dirs: list[str | Path]) -> list[dict]:
    rows = []
    for run_dir in run_dirs:
        path = Path(run_dir) / SUMMARY_NAME
        s = json.loads(path.read_text()) if path.exists() else {}
        _, loss = series(load_metrics(run_dir), "loss")
        rows.append(
            {
                "run": str(run_dir),
                "steps": s.get("steps", len(loss)),
                "loss_first": loss[0] if loss else None,
                "loss_last": loss[-1] if loss else None,
                "tokens_per_s": s.get("tokens_per_s"),
                "train_runtime_s": s.get("train_runtime_s"),
                "peak_rss_mib": max((r.get("peak_rss_mib", 0) for r in s.get("per_rank", [])), default=None),
            }
        )
    return rows


def format_rows(rows: list[dict]) -> str:
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    lines = [
        f"{'run':<40} {'steps':>6} {'loss first':>10} {'loss last':>10} {'tok/s':>8} {'time s':>8} {'peak RSS MiB':>12}"
    ]
    for r in rows:
        lines.append(
            f"{r['run'][-40:]:<40} {r['steps']:>6} {f(r['loss_first'], '.4f'):>10} {f(r['loss_last'], '.4f'):>10} "
            f"{f(r['tokens_per_s'], '.0f'):>8} {f(r['train_runtime_s'], '.1f'):>8} {f(r['peak_rss_mib'], '.0f'):>12}"
        )
    return "\n".join(lines)
