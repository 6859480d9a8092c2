"""The `fsdp-tune` command: parse -> call -> print. The only place that turns errors into exit codes.

Keep imports here light: `validate-config`, `rules` and `--help` must not import torch or the HF stack.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

# typer imports rich (~80 ms) for coloured help when it is installed; our output is plain text with
# click colours, and validate-config has a 0.25 s budget, so typer is told rich is absent.
if "rich" not in sys.modules:
    sys.modules["rich"] = None  # type: ignore[assignment]

import typer  # noqa: E402

from fsdp_tune import __version__  # noqa: E402
from fsdp_tune.errors import ConfigError, ExitCode, FsdpTuneError, PreflightError  # noqa: E402

app = typer.Typer(
    name="fsdp-tune",
    help="Check, launch and save FSDP2 + LoRA/QLoRA/DoRA fine-tuning runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Commands that take the seed-style training flags: unknown options are ours to parse, not click's.
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}

ConfigOpt = typer.Option(None, "--config", "-c", help="Accelerate YAML, Transformers fsdp_config JSON, or recipe.")
DebugOpt = typer.Option(False, "--debug", help="Show Python tracebacks.")


def _style(text: str, **kw) -> str:
    return typer.style(text, **kw) if sys.stderr.isatty() else text


def _split_config(config: Optional[str], args: list[str]) -> tuple[Optional[str], list[str]]:
    """The config file may be given positionally: `fsdp-tune validate-config fsdp.yaml --lora_r 8`."""
    if config is None and args and not args[0].startswith("-"):
        return args[0], args[1:]
    return config, args


def _fail(err: FsdpTuneError, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    from fsdp_tune.render import format_findings

    if isinstance(err, ConfigError):
        typer.echo(format_findings(err.subject, err.findings, _style), err=True)
    elif isinstance(err, PreflightError):
        typer.echo(_style("error:", fg="red", bold=True) + f" {err}", err=True)
        typer.echo(format_findings("this launch", err.findings, _style).split("\n", 1)[-1], err=True)
    else:
        typer.echo(_style("error:", fg="red", bold=True) + f" {err}", err=True)
        hint = getattr(err, "hint", "")
        if hint:
            typer.echo(f"  hint: {hint}", err=True)
    raise typer.Exit(int(err.exit_code))


def _guard(fn, debug: bool):
    try:
        return fn()
    except FsdpTuneError as err:
        _fail(err, debug)
    except KeyboardInterrupt:
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as err:  # a bug or an environment problem, not the user's input: say so, briefly
        if debug:
            raise
        typer.echo(_style("error:", fg="red", bold=True) + f" {type(err).__name__}: {err}", err=True)
        typer.echo("  hint: run again with --debug for the traceback", err=True)
        raise typer.Exit(int(ExitCode.TRAINING_FAILED)) from None


@app.command("validate-config", context_settings=PASSTHROUGH)
def validate_config(
    ctx: typer.Context,
    config: Optional[str] = ConfigOpt,
    as_json: bool = typer.Option(False, "--json", help="Print the resolved config and findings as JSON."),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings as errors."),
    debug: bool = DebugOpt,
) -> None:
    """Check a launch (config file + training flags) in well under a second, without importing torch.

    Every problem is reported at once, with the key, where it came from and a fix. Flags override the file.
    Flags: the seed launches' (--lora_r 8, --bf16 True, bare --push_to_hub; _ or -), any SFTConfig field,
    --fsdp_<key>, --parallelism_config_<key>, accelerate's --num_processes/--num_machines/--machine_rank/
    --main_process_ip/--main_process_port. Exit codes: 0 valid (warnings allowed), 2 invalid config or usage.
    """
    config, args = _split_config(config, list(ctx.args))

    def run() -> None:
        from fsdp_tune.config import check
        from fsdp_tune.render import checked_as_json, format_findings, format_settings

        checked = check(config, args)
        failed = bool(checked.errors) or (strict and bool(checked.warnings))
        subject = config or "the command line"
        if as_json:
            typer.echo(json.dumps(checked_as_json(checked), indent=2))
        else:
            if not checked.errors:
                typer.echo(f"{subject}: {checked.format or 'flags'} config, resolved settings:")
                typer.echo(format_settings(checked.config))
            if checked.findings:
                typer.echo(format_findings(subject, checked.findings, _style), err=True)
            if not failed:
                typer.echo(_style("ok:", fg="green", bold=True) + f" {subject} is a valid launch config")
            elif not checked.errors:
                typer.echo(_style("error:", fg="red", bold=True) + " warnings are errors with --strict", err=True)
        if failed:
            raise typer.Exit(int(ExitCode.BAD_CONFIG))

    _guard(run, debug)


@app.command("train", context_settings=PASSTHROUGH)
def train(
    ctx: typer.Context,
    config: Optional[str] = ConfigOpt,
    dry_run: bool = typer.Option(False, "--dry_run", "--dry-run", help="Print the plan; start nothing."),
    debug: bool = DebugOpt,
) -> None:
    """Validate, check this machine, then train through torchrun (same flags as validate-config).

    Also: --resume_from_checkpoint latest|PATH, --overwrite_output_dir, --max_restarts N, --ddp_timeout S,
    --save_on_interrupt false. Exit codes: 0 trained, 1 training failed, 2 bad config or pre-flight,
    130/143 interrupted.
    """
    config, args = _split_config(config, list(ctx.args))

    def run() -> None:
        from fsdp_tune import launch
        from fsdp_tune.render import format_findings, format_summary
        from fsdp_tune.train import describe, plan_run, preflight_error

        checked, plan, machine = plan_run(config, args, lambda m: typer.echo(m, err=True))
        if checked.findings:
            typer.echo(format_findings(config or "the command line", checked.findings, _style), err=True)
        typer.echo(describe(checked.config, plan))
        if dry_run:
            _dry_run_memory(checked.config, plan)
            if machine:
                typer.echo("this machine could not start it as it stands:", err=True)
                typer.echo(format_findings("this launch", machine, _style).split("\n", 1)[-1], err=True)
            typer.echo("dry run: nothing was started")
            return
        error = preflight_error(machine)
        if error:
            raise error
        from fsdp_tune import manifest

        resolved = launch.prepare(checked.config, plan)
        if plan.node_rank == 0:  # one manifest per run, even when the nodes share the output folder
            manifest.write_start(resolved, plan)
        outcome = launch.run(plan)
        if plan.node_rank == 0:
            manifest.write_end(plan, outcome.returncode)
        summary = launch.read_summary(plan)
        if outcome.returncode != 0 or outcome.signal is not None:
            if summary and "interrupted_at_step" in summary:
                saved = "checkpoint saved" if summary["checkpoint_saved"] else "no checkpoint (checkpoints are off)"
                typer.echo(
                    f"stopped at step {summary['interrupted_at_step']}: {saved}; continue with "
                    "--resume_from_checkpoint latest",
                    err=True,
                )
            raise launch.failure_report(plan, outcome)
        if summary:
            typer.echo(format_summary(summary))
        if plan.node_rank == 0:
            _plot(plan.output_dir)

    _guard(run, debug)


@app.command("plan", context_settings=PASSTHROUGH)
def plan_cmd(
    ctx: typer.Context,
    config: Optional[str] = ConfigOpt,
    gpu: str = typer.Option("h100", "--gpu", help="h100 | h200 | a100 | 4090 (memory, TFLOP/s, link)."),
    gpu_memory: Optional[str] = typer.Option(None, "--gpu_memory", "--gpu-memory", help="e.g. 80GiB, 24GB."),
    cpu: bool = typer.Option(False, "--cpu", help="Plan a CPU run (host memory per rank)."),
    as_json: bool = typer.Option(False, "--json"),
    debug: bool = DebugOpt,
) -> None:
    """Predict per-GPU and host memory and step time before launch, and what would make it fit."""
    config, args = _split_config(config, list(ctx.args))

    def run() -> None:
        from fsdp_tune.config import load
        from fsdp_tune.planner import make_plan
        from fsdp_tune.render import format_plan

        cfg = load(config, args).config
        result = make_plan(cfg, gpu, gpu_memory, on_cpu=cpu or cfg.launch.use_cpu)
        typer.echo(json.dumps(result, indent=2) if as_json else format_plan(result))

    _guard(run, debug)


@app.command("convert")
def convert_cmd(
    src: str = typer.Argument(..., help="Accelerate YAML, Transformers fsdp_config JSON, or recipe."),
    to: Optional[str] = typer.Option(None, "--to", help="accelerate | transformers | recipe (default: same)."),
    fsdp2: bool = typer.Option(False, "--fsdp2", help="Migrate FSDP1 settings to FSDP2."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Output file (default: beside SRC)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output file."),
    debug: bool = DebugOpt,
) -> None:
    """Convert between config formats through the typed config; --fsdp2 migrates FSDP1 to FSDP2."""

    def run() -> None:
        from fsdp_tune.convert import convert

        out, notes, diff = convert(src, to, fsdp2, output, force)
        for note in notes:
            typer.echo(f"note: {note}")
        if diff:
            typer.echo("changed settings:")
            typer.echo("\n".join(diff))
        typer.echo(_style("ok:", fg="green", bold=True) + f" wrote {out} (validates with fsdp-tune validate-config)")

    _guard(run, debug)


@app.command("merge")
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
        from fsdp_tune.merge import merge

        r = merge(adapter, base, output, dtype, max_shard_size, device, force)
        if r["quantized_adapter"]:
            typer.echo(
                f"note: QLoRA adapter: the base was loaded unquantized in {r['dtype']} (merging into 4-bit "
                "weights would round the update away)"
            )
        typer.echo(
            _style("ok:", fg="green", bold=True) + f" merged {r['base']} + {adapter} -> {r['output']}; "
            f"logits match base+adapter (max relative difference {r['max_rel_logit_diff']:.1e}, "
            f"tolerance {r['tolerance']:.0e})"
        )

    _guard(run, debug)


@app.command("report")
def report_cmd(
    runs: list[str] = typer.Argument(..., help="One or more run output dirs."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="Plot file (default: RUN/loss.png)."),
) -> None:
    """Print a run's summary again and redraw loss.png; several runs share one figure."""
    from pathlib import Path

    from fsdp_tune.report import format_rows, plot, summary_rows

    missing = [r for r in runs if not (Path(r) / "metrics.jsonl").exists()]
    if missing:
        typer.echo(f"error: no metrics.jsonl in {', '.join(missing)}", err=True)
        raise typer.Exit(int(ExitCode.BAD_CONFIG))
    typer.echo(format_rows(summary_rows(runs)))
    out = plot(runs, output or (Path(runs[0]) / "loss.png" if len(runs) == 1 else "loss.png"))
    typer.echo(f"plot: {out}")


@app.command("env")
def env_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """Print what a bug report needs: versions, CUDA/NCCL, GPUs, bitsandbytes, flash-attn, CPUs, RAM."""
    from fsdp_tune.envinfo import collect, format_info

    info = collect()
    typer.echo(json.dumps(info, indent=2) if as_json else format_info(info))


def _plot(output_dir: str) -> None:
    """loss.png after a run; a plotting problem is a warning, the run itself succeeded."""
    from fsdp_tune.report import plot

    try:
        typer.echo(f"  loss plot: {plot([output_dir], Path(output_dir) / 'loss.png')}")
    except Exception as err:  # noqa: BLE001
        typer.echo(
            f"warning: loss.png not drawn ({type(err).__name__}: {err}); try `fsdp-tune report {output_dir}`", err=True
        )


def _dry_run_memory(cfg, plan) -> None:
    """The planner's memory summary for a dry run; a model it cannot see is a note, not a failure."""
    from fsdp_tune.errors import UsageError
    from fsdp_tune.planner import make_plan
    from fsdp_tune.render import format_plan

    try:
        # the run the config describes: a GPU config on this CPU-only machine still gets its GPU plan
        result = make_plan(cfg, on_cpu=cfg.launch.use_cpu)
    except UsageError as err:
        typer.echo(f"note: no memory plan: {err}")
        return
    typer.echo("memory plan (fsdp-tune plan):")
    typer.echo("\n".join("  " + line for line in format_plan(result).splitlines()))


@app.command("rules")
def rules_cmd(as_json: bool = typer.Option(False, "--json")) -> None:
    """List the rule catalog: every check validate-config runs, with its id."""
    from fsdp_tune.rules import catalog

    rows = catalog()
    if as_json:
        typer.echo(json.dumps([{"id": i, "family": f, "title": t} for i, f, t in rows], indent=2))
        return
    for rule_id, family, title in rows:
        typer.echo(f"{rule_id}  {family:<12} {title}")


@app.callback(invoke_without_command=True)
def main_callback(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        typer.echo(f"fsdp-tune {__version__}")
        raise typer.Exit()


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":
    main()
