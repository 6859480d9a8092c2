"""Check a launch: read the file and the flags, normalize into the typed RunConfig, run every rule.

The one entry point the commands use (validate-config, train, plan, convert); torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fsdp_tune.config import fsdp2, idiom
from fsdp_tune.config.adapter_start import apply_adapter_start
from fsdp_tune.config.flags import parse_flags
from fsdp_tune.config.normalize import build_config
from fsdp_tune.config.readers import read_file
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.method_defaults import apply_method_defaults
from fsdp_tune.decide.template_defaults import apply_template_default
from fsdp_tune.decide.trl_defaults import apply_trl_defaults
from fsdp_tune.errors import ConfigError, Finding, Severity
from fsdp_tune.rules.catalog import run_rules


@dataclass(frozen=True)
class Checked:
    config: RunConfig
    findings: list[Finding]
    format: str | None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]


def check(
    config_path: str | None,
    argv: list[str],
    adopt_fsdp2: bool = True,
    scheduler=None,
    launch: bool = True,
    rules: bool = True,
) -> Checked:
    """Read the file and the flags (flags win), normalize, and run every rule. Never raises on bad values.
    adopt_fsdp2=False reads an Accelerate YAML without fsdp_version as accelerate does (FSDP1): `convert` only.
    `scheduler`: `train`'s merge of a scheduler's topology into the assignments (schedulers/merge.py).
    launch=False: a plan, not a launch (`plan`): where machine 0 is does not change a plan, so several machines
    without --main_process_ip get a placeholder address instead of FT092's refusal. rules=False: the typed config
    alone, for a caller that validates it afterwards (`--emit` reads the job's size, then plans and validates the
    job's own command line once)."""
    findings: list[Finding] = []
    assignments = []
    fmt = None
    if config_path:
        file_cfg = read_file(config_path)
        fmt = file_cfg.format
        assignments += file_cfg.assignments
        findings += file_cfg.findings
    flag_assignments, flag_findings = parse_flags(argv)
    findings += flag_findings
    assignments, idiom_findings = idiom.apply(assignments + flag_assignments)
    findings += idiom_findings
    if scheduler is not None:
        assignments, scheduler_findings = scheduler(assignments)
        findings += scheduler_findings
    cfg, value_findings = build_config(assignments, config_path)
    findings += value_findings
    if adopt_fsdp2:
        cfg, version_findings = fsdp2.adopt_fsdp2(cfg)  # no fsdp_version: FSDP2, said in one note
        findings += version_findings
    cfg, start_findings = apply_adapter_start(cfg)  # --adapter: its base model and LoRA shape
    findings += start_findings
    cfg, template_findings = apply_template_default(cfg)  # a model named apart from the file keeps its template
    findings += template_findings
    cfg, trl_findings = apply_trl_defaults(cfg)  # --use_peft: TRL's LoRA defaults, said in one note
    findings += trl_findings
    cfg, method_findings = apply_method_defaults(cfg)  # DPO/KTO: FSDP's activation checkpointing for TRL's default
    findings += method_findings
    if not launch:
        cfg = _placeholder_address(cfg)
    if rules:
        findings += run_rules(cfg)
    return Checked(cfg, findings, fmt)


PLACEHOLDER_ADDRESS = "MACHINE_0_ADDRESS"  # a plan's machine 0, never launched


def _placeholder_address(cfg: RunConfig) -> RunConfig:
    lc = cfg.launch
    if lc.num_machines <= 1 or lc.main_process_ip:
        return cfg
    return replace(cfg, launch=replace(lc, main_process_ip=PLACEHOLDER_ADDRESS))


def load(
    config_path: str | None, argv: list[str], strict: bool = False, scheduler=None, launch: bool = True
) -> Checked:
    """check(), raising ConfigError when there are errors (or warnings, with strict)."""
    checked = check(config_path, argv, scheduler=scheduler, launch=launch)
    if checked.errors or (strict and checked.warnings):
        raise ConfigError(config_path or "the command line", checked.findings)
    return checked
