"""Commands for after a run: merge, report, env."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from fsdp_tune.cli.common import PASSTHROUGH, ConfigOpt, DebugOpt, guard, split_config, style  # noqa: F401


def merge_cmd(
    adapter: str = typer.Option(..., "--adapter", help="The adapter folder (a run's output dir)."),
    output: str = typer.Option(..., "-o", "--output", help="Folder for the merged model."),
    base: Optional[str] = typer.Option(None, "--base", help="Base model (default: the adapter's record)."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 | fp16 | fp32"),
    max_shard_size: str = typer.Option("5GB", "--max_shard_size", "--max-shard-size"),
    device: str = typer.Option("cpu", "--device", help="cpu, or one GPU such as cuda:0"),
    force: bool = typer.Option(False, "--force", help="Write into a non-empty output folder."),
    debug: bool = DebugOpt,
) -> None:
    """Merge a LoRA/DoRA adapter into its base model, outside FSDP, and check the logits match."""

    def run() -> None:
        from fsdp_tune.tools.merge import merge

        r = merge(adapter, base, output, dtype, max_shard_size, device, force)
        if r["quantized_adapter"]:
            typer.echo(
                f"note: QLoRA adapter: the base was loaded unquantized in {r['dtype']} (merging into 4-bit "
                "weights would round the update away)"
            )
        typer.echo(
            style("ok:", fg="green", bold=True) + f" merged {r['base']} + {adapter} -> {r['output']}; "
            f"logits match base+adapter (max relative difference {r['max_rel_logit_diff']:.1e}, "
            f"tolerance {r['tolerance']:.0e})"
        )

    guard(run, debug)


def report_cmd(
    runs: list[str] = typer.Argument(..., help="One or more run output dirs."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Plot file (default: RUN/loss.png)."),
    debug: bool = DebugOpt,
) -> None:
    """Print a run's summary again and redraw loss.png; several runs share one figure."""

    def run() -> None:
        from fsdp_tune.errors import UsageError
        from fsdp_tune.output import format_rows
        from fsdp_tune.runfiles import LOSS_PLOT_NAME, METRICS_NAME
        from fsdp_tune.tools.report import plot, summary_rows

        missing = [r for r in runs if not (Path(r) / METRICS_NAME).exists()]
        if missing:
            raise UsageError(f"no {METRICS_NAME} in {', '.join(missing)}", "pass the output dir of a run")
        typer.echo(format_rows(summary_rows(runs)))
        out = plot(runs, output or (Path(runs[0]) / LOSS_PLOT_NAME if len(runs) == 1 else LOSS_PLOT_NAME))
        typer.echo(f"plot: {out}")

    guard(run, debug)


def env_cmd(as_json: bool = typer.Option(False, "--json"), debug: bool = DebugOpt) -> None:
    """Print what a bug report needs: versions, CUDA/NCCL, GPUs, bitsandbytes, flash-attn, CPUs, RAM."""

    def run() -> None:
        from fsdp_tune.output import format_info
        from fsdp_tune.tools.envinfo import collect

        info = collect()
        typer.echo(json.dumps(info, indent=2) if as_json else format_info(info))

    guard(run, debug)
