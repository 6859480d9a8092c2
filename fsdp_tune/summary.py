"""The run summary rank 0 writes at the end (OUTPUT_DIR/fsdp_tune_summary.json), typed.

The worker fills it in, the launcher prints it, `report` compares several. No torch: both sides read it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fsdp_tune.errors import UsageError
from fsdp_tune.runfiles import SUMMARY_NAME, Unreadable, read_bounded, write_atomic


@dataclass(frozen=True)
class RankMemory:
    peak_rss_mib: float
    peak_gpu_allocated_mib: float | None = None
    peak_gpu_reserved_mib: float | None = None


@dataclass(frozen=True)
class RunSummary:
    """A finished run."""

    steps: int
    loss_first: float | None
    loss_last: float | None
    losses: list[float]
    train_runtime_s: float
    time_to_first_step_s: float | None
    wall_s: float
    tokens: int
    tokens_per_s: float | None
    per_rank: list[RankMemory]
    fsdp_units: dict[str, int]
    adapter_dir: str
    use_peft_lora: bool
    truncated_sequences: dict[str, int] | None = None  # {"cut", "total", "max_seq_len"}
    vocab_grew: dict[str, int] | None = None  # {"from", "tokenizer", "rows"}
    adapter_check: dict[str, Any] | None = None  # verify_adapter's result
    mesh: dict[str, int] | None = None  # the device mesh read from the trained parameters: dim name -> size
    data: dict[str, Any] | None = None  # worker/data/prepare.py's report: formats, rows skipped and why, loss share
    trackers: dict[str, str] | None = None  # --report_to: tracker -> where its files or its run went
    method: str = "sft"  # the training method (config/methods.py)
    # the method's own metrics (config/methods.py METRICS), as logged: key -> {"first", "last"}
    method_metrics: dict[str, dict[str, float]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    kind = "finished"


@dataclass(frozen=True)
class Interrupted:
    """A run stopped on request (signal, stop file): the checkpoint, if any, is what it leaves."""

    interrupted_at_step: int
    checkpoint_saved: bool
    signal: int | None = None  # what asked (the ranks' or the launcher's signal); None: the stop file alone

    kind = "interrupted"


# the launch that started the ranks (launch/train.py): its summary is told from a previous attempt's by it
ATTEMPT_ENV = "FSDP_TUNE_ATTEMPT"


def write(output_dir: str | Path, summary: RunSummary | Interrupted, run_id: str | None = None) -> Path:
    """Over the previous attempt's summary, if any (it stays until this one exists: a failed attempt leaves the
    finished run's summary as it was). `run_id`: the run the ranks were started for (the launcher writes it beside
    the rank spec); the attempt comes in the ranks' environment from torchrun (launch/torchrun.py)."""
    data = {"kind": summary.kind, "run_id": run_id, "attempt": os.environ.get(ATTEMPT_ENV)}
    data.update(asdict(summary))
    return write_atomic(Path(output_dir) / SUMMARY_NAME, json.dumps(data, indent=2))


def read(output_dir: str | Path, attempt: str | None = None) -> RunSummary | Interrupted | None:
    """The folder's summary; with `attempt`, only the one that attempt's ranks wrote (None otherwise)."""
    path = Path(output_dir) / SUMMARY_NAME
    try:
        data = json.loads(read_bounded(path, MAX_SUMMARY_BYTES))
    except FileNotFoundError:
        return None
    except (Unreadable, ValueError) as err:  # a FIFO, a device, a huge file, not JSON: a finding, never exit 3
        raise _not_a_summary(path, str(err) if isinstance(err, Unreadable) else f"not JSON ({err})") from None
    if not isinstance(data, dict):
        raise _not_a_summary(path, "not a JSON object")
    if attempt is not None and data.get("attempt") != attempt:
        return None
    data.pop("attempt", None)
    kind = data.pop("kind", "finished")
    try:
        if kind == Interrupted.kind:
            return Interrupted(**_known(Interrupted, data))
        data["per_rank"] = [RankMemory(**_known(RankMemory, r)) for r in data.get("per_rank", [])]
        return RunSummary(**_known(RunSummary, data))
    except (TypeError, AttributeError) as err:  # fields missing, or per_rank not a list of objects
        raise _not_a_summary(path, f"not a run summary ({err})") from None


MAX_SUMMARY_BYTES = 64 << 20  # a summary holds one loss per logged step: a few MiB for the longest runs


class NotASummary(UsageError, ValueError):
    """A summary file that cannot be read as one: exit 2 naming it (`report`); a ValueError to the launcher, which
    reads a failed attempt's folder and reports the failure instead."""


def _not_a_summary(path: Path, why: str) -> NotASummary:
    return NotASummary(
        f"{path}: {why}",
        "it is not the summary fsdp-tune writes; move it aside (the run's metrics.jsonl still reads)",
    )


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Fields of `cls` only: a summary written by a newer fsdp-tune still reads."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}
