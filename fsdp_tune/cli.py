"""The `fsdp-tune` command: parse -> call -> print. The only place that turns errors into exit codes.

Keep imports here light: `validate-config`, `rules` and `--help` must not import torch or the HF stack.
"""

from __future__ import annotations

import json
import os
import sys
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
    Exit codes: 0 valid (warnings allowed), 2 invalid config or usage.
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

    Exit codes: 0 trained, 1 training failed, 2 bad config or pre-flight, 130/143 interrupted.
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
            if machine:
                typer.echo("this machine could not start it as it stands:", err=True)
                typer.echo(format_findings("this launch", machine, _style).split("\n", 1)[-1], err=True)
            typer.echo("dry run: nothing was started")
            return
        error = preflight_error(machine)
        if error:
            raise error
        launch.prepare(checked.config, plan)
        outcome = launch.run(plan)
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

    _guard(run, debug)


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
