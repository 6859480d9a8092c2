"""Commands that read configs and nothing else: validate-config, rules, convert (no torch)."""

from __future__ import annotations

import json
from typing import Optional

import typer

from fsdp_tune.cli.common import ConfigOpt, DebugOpt, guard, split_config, style
from fsdp_tune.errors import ExitCode


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
    --main_process_ip/--main_process_port. The data files and model folder it can see are read as train's
    pre-flight reads them: one that does not exist, or data whose columns match no format, is an error.
    Exit codes: 0 valid (warnings allowed), 2 invalid config or usage, or files the launch could not use.
    """
    config, args = split_config(config, list(ctx.args))

    def run() -> None:
        from dataclasses import replace

        from fsdp_tune.output.findings import checked_as_json, format_findings, format_settings
        from fsdp_tune.validate import check

        checked = check(config, args)
        c = checked.config
        if c.model.model_name_or_path or c.data.dataset_name or c.data.datasets:  # files named (else ~0.1 s saved)
            from fsdp_tune.preflight.checks import check_files

            # the data files and model folder this machine can see, as train's pre-flight reads them (no torch)
            checked = replace(checked, findings=checked.findings + check_files(c))
        failed = bool(checked.errors) or (strict and bool(checked.warnings))
        subject = config or "the command line"
        if as_json:
            typer.echo(json.dumps(checked_as_json(checked), indent=2))
        else:
            if not checked.errors:
                typer.echo(f"{subject}: {checked.format or 'flags'} config, resolved settings:")
                typer.echo(format_settings(checked.config))
            if checked.findings:
                typer.echo(format_findings(subject, checked.findings, style), err=True)
            if not failed:
                typer.echo(style("ok:", fg="green", bold=True) + f" {subject} is a valid launch config")
            elif not checked.errors:
                typer.echo(style("error:", fg="red", bold=True) + " warnings are errors with --strict", err=True)
        if failed:
            raise typer.Exit(int(ExitCode.BAD_CONFIG))

    guard(run, debug)


def rules_cmd(as_json: bool = typer.Option(False, "--json"), debug: bool = DebugOpt) -> None:
    """List the rule catalog: every check validate-config runs, with its id."""

    def run() -> None:
        from fsdp_tune.rules.catalog import catalog

        rows = catalog()
        if as_json:
            typer.echo(json.dumps([{"id": i, "family": f, "title": t} for i, f, t in rows], indent=2))
            return
        for rule_id, family, title in rows:
            typer.echo(f"{rule_id}  {family:<12} {title}")

    guard(run, debug)


def flags_cmd(
    word: Optional[str] = typer.Argument(None, metavar="[GROUP|WORD]", help="A group (lora, training, ...) or a word."),
    as_json: bool = typer.Option(False, "--json"),
    debug: bool = DebugOpt,
) -> None:
    """List the flags train, validate-config and plan take: kind, default, allowed values, what each sets.

    `fsdp-tune flags lora` lists a group, `fsdp-tune flags scheduler` every flag with that word in its name."""

    def run() -> None:
        from fsdp_tune.errors import UsageError
        from fsdp_tune.output.flags import GROUPS, format_flags, select

        found = select(word)
        if not found:
            raise UsageError(f"no flag matches {word!r}", f"a group ({', '.join(GROUPS)}) or part of a flag's name")
        if as_json:
            typer.echo(json.dumps(found, indent=2, default=str))
        else:
            typer.echo(format_flags(found, full_choices=len(found) <= 3))

    guard(run, debug)


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
        from fsdp_tune.tools.convert import convert

        out, notes, diff = convert(src, to, fsdp2, output, force)
        for note in notes:
            typer.echo(f"note: {note}")
        if diff:
            typer.echo("changed settings:")
            typer.echo("\n".join(diff))
        typer.echo(style("ok:", fg="green", bold=True) + f" wrote {out} (validates with fsdp-tune validate-config)")

    guard(run, debug)
