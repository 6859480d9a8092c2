"""Read a run's metrics back, print the summary table, draw loss.png (several runs on one figure).

A run folder may come from someone else: its files are read bounded (runfiles.read_bounded: a FIFO or a link to
/dev/zero is refused, never more than MAX_METRICS_BYTES), and a line that is not a metrics record is an exit 2
naming file:line. RUN/loss.png is the run's own file, replaced whole (never written through a link); a plot
anywhere else goes through the writer door (output/files.py: --force for an existing file)."""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_tune import summary as run_summary
from fsdp_tune.config.methods import SFT, metric_keys, row_of
from fsdp_tune.errors import UsageError
from fsdp_tune.printable import printable
from fsdp_tune.runfiles import (
    MANIFEST_NAME,
    METRICS_NAME,
    RESOLVED_NAME,
    Unreadable,
    new_file_mode,
    read_bounded,
    write_atomic,
)

MAX_METRICS_BYTES = 512 << 20  # ~1.5 million logged steps at ~300 bytes a line
MAX_SPEC_BYTES = 64 << 20


def load_metrics(run_dir: str | Path) -> list[dict]:
    """The run's metrics records, each an object with an integer step; anything else is a UsageError (exit 2)
    naming the file and line."""
    path = Path(run_dir) / METRICS_NAME
    try:
        data = read_bounded(path, MAX_METRICS_BYTES)
    except FileNotFoundError:
        if path.is_symlink():
            raise UsageError(f"{path} is a link to nothing: not read", "pass the output dir of a run") from None
        return []
    except Unreadable as err:
        raise UsageError(str(err), "pass the output dir of a run fsdp-tune wrote") from None
    records = []
    for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if line.strip():
            records.append(_record(line, f"{path}:{number}"))
    return records


def _record(line: str, where: str) -> dict:
    hint = "a line of metrics.jsonl is one JSON object with an integer step, as fsdp-tune writes it; remove this one"
    try:
        record = json.loads(line)
    except ValueError as err:
        raise UsageError(f"{where}: not a JSON line ({err})", hint) from None
    if not isinstance(record, dict):
        raise UsageError(f"{where}: not a JSON object", hint)
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise UsageError(f"{where}: no integer step (step: {json.dumps(step)[:40]})", hint)
    return record


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; a resumed run's repeated steps keep their last value; a value that is no
    number is left out."""
    by_step: dict[int, float] = {}
    for r in records:
        value = r.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            by_step[int(r["step"])] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def method_of(run_dir: str | Path) -> str:
    """The run's training method, from the rank spec it ran (read as JSON: a spec of another fsdp-tune version
    still says it), else its summary's, else SFT."""
    try:
        spec = json.loads(read_bounded(Path(run_dir) / RESOLVED_NAME, MAX_SPEC_BYTES)).get("spec") or {}
    except (OSError, ValueError, AttributeError):  # Unreadable (a FIFO, a device) is a ValueError: the summary says
        spec = {}
    method = spec.get("method") if isinstance(spec, dict) else None
    if isinstance(method, dict) and method.get("name"):  # spec version 3: the method's part
        return str(method["name"])
    if isinstance(method, str) and method:  # spec version 2 named it alone
        return method
    s = run_summary.read(run_dir)
    return s.method if isinstance(s, run_summary.RunSummary) else SFT


def figure(run_dirs: list[str | Path]):
    """One figure for all runs: each run's training loss (a line) and eval loss (dashed, with points) in the
    run's own colour above, its learning rate below; for the other methods, their own metrics between (DPO's
    reward accuracy and margin, KTO's KL and margin, a reward model's accuracy and margin; GRPO's reward with each
    function's, completion length and KL)."""
    # matplotlib's object API without pyplot: half the import time, and no GUI backend is ever touched
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    methods = [method_of(r) for r in run_dirs]
    extra = any(row_of(m).metrics for m in methods)
    panels = max((row_of(m).panels for m in methods if row_of(m).metrics), default=0)
    fig = Figure(figsize=(8, 6 + 1.5 * panels))
    FigureCanvasAgg(fig)
    ratios = [3, *[2] * panels, 1]
    axes = fig.subplots(len(ratios), 1, sharex=True, gridspec_kw={"height_ratios": ratios})
    ax_loss, ax_lr = axes[0], axes[-1]
    if extra:
        _method_panels(axes[1 : 1 + panels], run_dirs, methods)
    for i, (run_dir, label) in enumerate(zip(run_dirs, labels(run_dirs), strict=True)):
        colour = f"C{i % 10}"
        records = load_metrics(run_dir)
        steps, loss = series(records, "loss")
        ax_loss.plot(steps, loss, color=colour, marker="." if len(steps) < 50 else None, label=f"{label} train")
        e_steps, e_loss = series(records, "eval_loss")
        if e_steps:
            ax_loss.plot(e_steps, e_loss, color=colour, marker="o", linestyle="--", label=f"{label} eval")
        lr_steps, lr = series(records, "learning_rate")
        ax_lr.plot(lr_steps, lr, color=colour, label=label)
    ax_loss.set_ylabel("loss")
    ax_loss.legend(fontsize="small")
    ax_loss.grid(alpha=0.3)
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _method_panels(axes, run_dirs: list[str | Path], methods: list[str]) -> None:
    """Each run's first metrics (config/methods.py: its row's), one panel each, in the run's colour; the first panel
    also has each of the row's `*` metrics (GRPO: every reward function's mean), dotted."""
    names: list[set[str]] = [set() for _ in axes]
    dotted = False
    for i, (run_dir, label, method) in enumerate(zip(run_dirs, labels(run_dirs), methods, strict=True)):
        records = load_metrics(run_dir)
        row = row_of(method)
        plotted = [(m.key, m.label) for m in row.metrics if "*" not in m.key][: len(axes)]
        for ax, (key, name), seen in zip(axes, plotted, names, strict=False):
            steps, values = series(records, key)
            if steps:
                ax.plot(steps, values, color=f"C{i % 10}", marker="." if len(steps) < 50 else None, label=label)
                seen.add(name)
        literal = {m.key for m in row.metrics}
        for key, name in metric_keys(row, {k for r in records for k in r}):
            if key not in literal:
                steps, values = series(records, key)
                axes[0].plot(steps, values, color=f"C{i % 10}", linestyle=":", label=f"{label} {name}")
                dotted = True
    if dotted:
        axes[0].legend(fontsize="x-small")
    for ax, seen in zip(axes, names, strict=True):
        ax.set_ylabel(" / ".join(sorted(seen)) or "-", fontsize="small")
        ax.grid(alpha=0.3)


def labels(run_dirs: list[str | Path]) -> list[str]:
    """Each run's folder name; the whole path where two runs share a name (runs/a/out, runs/b/out)."""
    names = [Path(r).name for r in run_dirs]
    shown = [n if names.count(n) == 1 else str(r) for n, r in zip(names, run_dirs, strict=True)]
    return [printable(n, keep="") for n in shown]  # a folder name's controls, shown escaped in the figure too


def plot(run_dirs: list[str | Path], out: str | Path) -> Path:
    """The figure into a run folder's own loss.png (or another file the run owns): replaced whole, never written
    through a link; `drawn` for a file outside a run folder (the writer door)."""
    return write_atomic(out, drawn(run_dirs, out), new_file_mode())


def drawn(run_dirs: list[str | Path], out: str | Path) -> bytes:
    """The figure as `out`'s suffix names its format (png without one)."""
    import io

    fig = figure(run_dirs)
    fmt = Path(out).suffix.lstrip(".").lower() or "png"
    formats = fig.canvas.get_supported_filetypes()
    if fmt not in formats:
        raise UsageError(f"-o {out}: matplotlib draws no .{fmt} files", f"one of: {', '.join(sorted(formats))}")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100)
    return buf.getvalue()


def summary_rows(run_dirs: list[str | Path]) -> list[dict]:
    """One row per run for the side-by-side table: from its summary when it finished, its metrics otherwise."""
    rows = []
    for run_dir in run_dirs:
        s = run_summary.read(run_dir)
        finished = s if isinstance(s, run_summary.RunSummary) else None
        status, cause = ("finished" if finished else "interrupted", None) if s else _ended(run_dir)
        records = load_metrics(run_dir)
        _, loss = series(records, "loss")
        _, eval_loss = series(records, "eval_loss")
        peaks = [r.peak_gpu_reserved_mib or r.peak_rss_mib for r in finished.per_rank] if finished else []
        peaks = [p for p in peaks if isinstance(p, (int, float)) and not isinstance(p, bool)]
        rows.append(
            {
                "run": str(run_dir),
                "status": status,
                "steps": finished.steps if finished else (max((int(r["step"]) for r in records), default=0)),
                "loss_last": loss[-1] if loss else None,
                "eval_loss_last": eval_loss[-1] if eval_loss else None,
                "tokens_per_s": finished.tokens_per_s if finished else None,
                "time_to_first_step_s": finished.time_to_first_step_s if finished else None,
                "train_runtime_s": finished.train_runtime_s if finished else None,
                "peak_memory_mib": max(peaks) if peaks else None,
                "method": method_of(run_dir),
                **_method_values(records, method_of(run_dir)),
                **({"cause": cause} if cause else {}),
            }
        )
    return rows


def _ended(run_dir: str | Path) -> tuple[str, str | None]:
    """("failed", why) for a run whose last attempt failed (its manifest's record), ("interrupted", which signal)
    for one stopped before its ranks wrote a summary, else ("incomplete", None): one being written, or killed."""
    try:
        data = json.loads(read_bounded(Path(run_dir) / MANIFEST_NAME, MAX_SPEC_BYTES))
        last = (data.get("attempts") or [data])[-1]
    except (OSError, Unreadable, ValueError, AttributeError, TypeError, IndexError):
        return "incomplete", None
    if not isinstance(last, dict) or last.get("exit_status") in (None, 0):
        return "incomplete", None
    cause = last.get("cause") or f"exit status {last['exit_status']}"
    return ("interrupted" if cause.startswith("stopped by") else "failed"), cause


def _method_values(records: list[dict], method: str) -> dict:
    """The last logged value of the method's first two metrics, under neutral names for the table."""
    out = {}
    for column, (key, _) in zip(
        ("metric_1", "metric_2"), [(m.key, m.label) for m in row_of(method).metrics][:2], strict=False
    ):
        _, values = series(records, key)
        out[column] = {"key": key, "last": values[-1] if values else None}
    return out
