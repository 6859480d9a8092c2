"""The rule catalog: run every registered rule; list them for `fsdp-tune rules`.

All rules run on every check and every finding is reported, so a user fixes everything in one round.
"""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import derive
from fsdp_tune.decide.machine import Machine
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import READER_RULES, REGISTRY


def run_rules(cfg: RunConfig) -> list[Finding]:
    """Every rule, on the config as written (the decisions without a machine: decide/derived.py)."""
    _load_families()
    decided = derive(cfg)
    findings: list[Finding] = []
    for r in REGISTRY.values():
        findings.extend(r.fn(cfg, decided) if r.decided else r.fn(cfg))
    return findings


def machine_findings(cfg: RunConfig, machine: Machine, known: list[Finding]) -> list[Finding]:
    """The rules on the decisions, again, for the machine `train` launches on (a config for GPUs on a machine
    without any: FSDP1 and context parallelism cannot run, offload has no effect); what the config's own check
    found already (`known`) is not said twice."""
    _load_families()
    decided = derive(cfg, machine)
    seen = {(f.rule, f.key, f.message) for f in known}
    found = [f for r in REGISTRY.values() if r.decided for f in r.fn(cfg, decided)]
    return [f for f in found if (f.rule, f.key, f.message) not in seen]


def catalog() -> list[tuple[str, str, str]]:
    _load_families()
    rows = [(rid, fam, title) for rid, (fam, title) in READER_RULES.items()]
    rows += [(r.id, r.family, r.title) for r in REGISTRY.values()]
    return sorted(rows)


def _load_families() -> None:
    from fsdp_tune.rules import (  # noqa: F401
        adapters,
        data,
        fsdp,
        generating,
        launch,
        lora,
        method,
        model,
        parallelism,
        preference,
        quant,
        training,
        vision,
    )
