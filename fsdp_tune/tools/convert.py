"""`fsdp-tune convert`: between the formats through the typed config, and FSDP1 -> FSDP2."""

from __future__ import annotations

import tempfile
from dataclasses import fields
from pathlib import Path

from fsdp_tune.config.fsdp2 import adopt_fsdp2, implicit_fsdp1, migrate_to_fsdp2
from fsdp_tune.config.readers import ACCELERATE as ACCEL_IN
from fsdp_tune.config.readers import MANIFEST, TRL
from fsdp_tune.config.schema import SECTIONS, RunConfig
from fsdp_tune.config.writers import ACCELERATE, FORMATS, RECIPE, TRANSFORMERS, render, yaml_comments
from fsdp_tune.errors import ConfigError, Finding, UsageError
from fsdp_tune.output.files import write_out
from fsdp_tune.rules.catalog import run_rules
from fsdp_tune.rules.registry import REGISTRY
from fsdp_tune.validate import check


def settings_diff(old: RunConfig, new: RunConfig) -> list[str]:
    lines = []
    for section in SECTIONS:
        a, b = getattr(old, section), getattr(new, section)
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if x != y:
                lines.append(f"  {section}.{f.name}: {_show(x)} -> {_show(y)}")
    return lines


def _show(v) -> str:
    return ",".join(v) if isinstance(v, tuple) else str(v).lower() if isinstance(v, bool) else str(v)


def default_output(src: Path, fmt: str, fsdp2: bool) -> Path:
    suffix = ".json" if fmt == TRANSFORMERS else ".yaml"
    tag = {ACCELERATE: "accelerate", TRANSFORMERS: "fsdp_config", RECIPE: "recipe"}[fmt]
    return src.with_name(f"{src.stem}{'.fsdp2' if fsdp2 else ''}.{tag}{suffix}")


def convert(
    src: str, to: str | None, fsdp2: bool, output: str | None, force: bool
) -> tuple[Path, list[str], list[str]]:
    """Returns (written file, notes, settings diff). Refuses to overwrite without force."""
    checked = check(src, [], adopt_fsdp2=False)  # as written: the migration below is said and diffed
    cfg = checked.config
    if blocking := _blocking(checked.errors, cfg, fsdp2):
        raise ConfigError(src, [f for f in checked.findings if f not in checked.errors or f in blocking])
    fmt = to or _same_format(checked.format)
    if fmt not in FORMATS:
        raise UsageError(f"--to {fmt}: unknown format", f"one of: {', '.join(FORMATS)}")
    new, notes = cfg, []
    if fsdp2:
        new, notes = migrate_to_fsdp2(cfg)
    elif implicit_fsdp1(cfg):
        # no fsdp_version: written as what `train` runs (config/fsdp2.py), explicitly
        new, findings = adopt_fsdp2(cfg)
        notes = [f.message for f in findings]
    if fmt == TRANSFORMERS:
        lost = [
            s
            for s in ("launch", "model", "data", "lora", "quantization", "training")
            if s != "launch" and _has_settings(cfg, s)
        ]
        if lost or cfg.launch.num_processes != 1:
            notes.append(
                "a Transformers fsdp_config holds FSDP settings only: launch"
                + (f", {', '.join(lost)}" if lost else "")
                + " settings are not in the output "
                "(pass them as flags)"
            )
    out = Path(output) if output else default_output(Path(src), fmt, fsdp2)
    text = Path(src).read_text()
    header, comments = yaml_comments(text) if not src.endswith(".json") else ([], {})
    if fmt == TRANSFORMERS:
        header, comments = [], {}
    if fmt != _same_format(checked.format):
        comments = {}  # key paths differ between formats; the header block still applies
    content = render(new, fmt, header=[h for h in header if "Run:" not in h], comments=comments)
    with tempfile.TemporaryDirectory(prefix="fsdp-tune-convert-") as scratch:  # checked before it is written
        trial = Path(scratch) / out.name
        trial.write_text(content)
        written = check(str(trial), [])
    if written.errors:
        raise ConfigError(f"the converted {out}", written.findings)
    write_out(out, content, force)  # the writer door: --force for an existing file, never through a link, atomic
    return out, notes, settings_diff(cfg, new)


def _blocking(errors: list[Finding], cfg: RunConfig, fsdp2: bool) -> list[Finding]:
    """The errors that stop the conversion: with --fsdp2, not those a rule raises only on the FSDP1 file (FT022,
    FSDP1 on CPU: the conversion is its fix, and the file written is checked again)."""
    if not fsdp2 or not errors:
        return errors
    migrated, _ = migrate_to_fsdp2(cfg)
    still = {f.rule for f in run_rules(migrated)}
    return [e for e in errors if e.rule not in REGISTRY or e.rule in still]


def _has_settings(cfg: RunConfig, section: str) -> bool:
    if section == "training":
        return bool(cfg.training.args)
    return any(p.startswith(section + ".") for p in cfg.origins)


def _same_format(read_as: str | None) -> str:
    """The format to write when --to is not given: the input's own; a run manifest and TRL's flat config file
    become a recipe (fsdp-tune writes no TRL file)."""
    if read_as == ACCEL_IN:
        return ACCELERATE
    if read_as in (MANIFEST, TRL):
        return RECIPE
    return read_as or RECIPE
