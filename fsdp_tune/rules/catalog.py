"""The rule catalog: run every registered rule; list them for `fsdp-tune rules`.

All rules run on every check and every finding is reported, so a user fixes everything in one round.
"""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import READER_RULES, REGISTRY


def run_rules(cfg: RunConfig) -> list[Finding]:
    _load_families()
    findings: list[Finding] = []
    for r in REGISTRY.values():
        findings.extend(r.fn(cfg))
    return findings


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
