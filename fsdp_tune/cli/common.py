"""What every command shares: the option types, the error boundary (the only place that turns errors into
exit codes and text) and colour when stderr is a terminal. Kept light: no torch, no HF stack.

Everything a command prints reaches the console through output/console.py's ConsoleStream (sys.stdout and
sys.stderr, installed by cli/app.py's main): control characters in any printed value come out escaped."""

from __future__ import annotations

import sys
from typing import Optional

import typer  # rich is kept out by fsdp_tune/cli/__init__.py

from fsdp_tune.errors import ConfigError, ExitCode, FsdpTuneError, PreflightError

# Commands that take the seed-style training flags: unknown options are ours to parse, not click's.
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": ["-h", "--help"]}

ConfigOpt = typer.Option(None, "--config", "-c", help="Accelerate YAML, Transformers fsdp_config JSON, or recipe.")
DebugOpt = typer.Option(False, "--debug", help="Show Python tracebacks.")

__all__ = [
    "PASSTHROUGH",
    "ConfigOpt",
    "DebugOpt",
    "Optional",
    "echo_out",
    "guard",
    "split_config",
    "style",
]


def style(text: str, **kw) -> str:
    """fsdp-tune's own words in colour, where the console door (output/console.py) shows colour: a terminal."""
    from fsdp_tune.output.console import ConsoleStream, colour

    return colour(text, **kw) if isinstance(sys.stderr, ConsoleStream) and sys.stderr.isatty() else text


def echo_out(text: str) -> None:
    """A result on stdout. A reader that went away (`fsdp-tune train | head`) is no failure of the command:
    stdout then points at /dev/null, so later writes and the flush at exit succeed too."""
    import os

    try:
        typer.echo(text)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def split_config(config: Optional[str], args: list[str]) -> tuple[Optional[str], list[str]]:
    """The config file may be given positionally: `fsdp-tune validate-config fsdp.yaml --lora_r 8`."""
    if config is None and args and not args[0].startswith("-"):
        return args[0], args[1:]
    return config, args


def fail(err: FsdpTuneError, debug: bool) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    from fsdp_tune.output.findings import format_findings

    if isinstance(err, ConfigError):
        typer.echo(format_findings(err.subject, err.findings, style), err=True)
    elif isinstance(err, PreflightError):
        typer.echo(style("error:", fg="red", bold=True) + f" {err}", err=True)
        typer.echo(format_findings("this launch", err.findings, style).split("\n", 1)[-1], err=True)
    else:
        stopped = err.exit_code in (ExitCode.INTERRUPTED, ExitCode.TERMINATED)  # on request: not an error
        label = style("interrupted:", fg="yellow", bold=True) if stopped else style("error:", fg="red", bold=True)
        typer.echo(label + f" {err}", err=True)
        hint = getattr(err, "hint", "")
        if hint:
            typer.echo(f"  hint: {hint}", err=True)
    raise typer.Exit(int(err.exit_code))


def guard(fn, debug: bool):
    try:
        return fn()
    except FsdpTuneError as err:
        fail(err, debug)
    except KeyboardInterrupt:
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as err:  # a bug or an environment problem, not the user's input: say so, briefly
        if debug:
            raise
        typer.echo(style("error:", fg="red", bold=True) + f" internal error: {type(err).__name__}: {err}", err=True)
        typer.echo("  hint: run again with --debug for the traceback, and report it", err=True)
        raise typer.Exit(int(ExitCode.INTERNAL_ERROR)) from None
