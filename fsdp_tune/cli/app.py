"""The `fsdp-tune` command: one Typer app; each command is a small function in check_cmds, run_cmds or
after_cmds (parse -> call -> print), and cli/common.py is the only place errors become exit codes.

Keep imports here light: `validate-config`, `rules` and `--help` must not import torch or the HF stack.
"""

from __future__ import annotations

import os
import sys

import typer

from fsdp_tune import __version__
from fsdp_tune.cli import after_cmds, check_cmds, run_cmds
from fsdp_tune.cli.common import PASSTHROUGH
from fsdp_tune.output.console import ConsoleStream
from fsdp_tune.output.flags import help_epilog

app = typer.Typer(
    name="fsdp-tune",
    help="Check, launch and save FSDP2 + LoRA/QLoRA/DoRA fine-tuning runs.\n\n"
    "Training flags: `fsdp-tune train --help` lists the common ones by group, `fsdp-tune flags` all of them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("validate-config", context_settings=PASSTHROUGH, epilog=help_epilog())(check_cmds.validate_config)
app.command("train", context_settings=PASSTHROUGH, epilog=help_epilog())(run_cmds.train)
app.command("plan", context_settings=PASSTHROUGH, epilog=help_epilog())(run_cmds.plan_cmd)
app.command("rows", context_settings=PASSTHROUGH)(run_cmds.rows_cmd)
app.command("flags")(check_cmds.flags_cmd)
app.command("convert")(check_cmds.convert_cmd)
app.command("chat")(after_cmds.chat_cmd)
app.command("merge")(after_cmds.merge_cmd)
app.command("export")(after_cmds.export_cmd)
app.command("report")(after_cmds.report_cmd)
app.command("env")(after_cmds.env_cmd)
app.command("rules")(check_cmds.rules_cmd)


@app.callback(invoke_without_command=True)
def main_callback(
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    if version:
        typer.echo(f"fsdp-tune {__version__}")
        raise typer.Exit()


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the console door: every value printed is cleaned there (output/console.py), and `fsdp-tune ... | head` ends well
    sys.stdout, sys.stderr = ConsoleStream(sys.stdout), ConsoleStream(sys.stderr)
    app()
