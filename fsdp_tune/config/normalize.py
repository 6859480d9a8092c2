"""Coerce raw assignments into the typed RunConfig, with a finding for every value that cannot be.

Later assignments win (defaults < config file < flags). Values are coerced by the kind of their field
(see values.py) and checked against its `choices`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fsdp_tune.config import keys
from fsdp_tune.config.lora_fields import PeftSettings
from fsdp_tune.config.methods import SFT
from fsdp_tune.config.schema import FLOAT_DTYPES, SECTIONS, Assignment, RunConfig, TrainingSettings
from fsdp_tune.config.spellings import disagreements
from fsdp_tune.config.values import BadValue, coerce, to_int, value_hint
from fsdp_tune.errors import Finding, Severity


def _reshard_value(raw: Any, version: int) -> tuple[str, Any]:
    """FSDP1 files may give reshard_after_forward as a strategy name; that means sharding_strategy."""
    if isinstance(raw, str) and raw.strip().upper() in keys.STRATEGY_TO_RESHARD:
        return "fsdp.sharding_strategy", raw.strip().upper()
    return "fsdp.reshard_after_forward", raw


def build_config(assignments: list[Assignment], config_path: str | None = None) -> tuple[RunConfig, list[Finding]]:
    findings: list[Finding] = []
    final: dict[str, Assignment] = {}
    for a in assignments:
        final[a.path] = a  # later wins: files first, flags last

    version = 2
    if "fsdp.version" in final:
        try:
            version = to_int(final["fsdp.version"].value)
        except BadValue:
            version = 2
    method = _method(final)
    values: dict[str, Any] = {}
    origins = {}
    for path, a in final.items():
        target, raw = (path, a.value)
        if path == "fsdp.reshard_after_forward":
            target, raw = _reshard_value(a.value, version)
            if target == "fsdp.sharding_strategy" and version == 2:
                findings.append(
                    Finding(
                        "FT011",
                        Severity.ERROR,
                        a.origin.key,
                        a.origin.source,
                        f"FSDP2 reshard_after_forward must be true or false, got {a.value!r} (an FSDP1 strategy name)",
                        f"`{a.origin.key}: {str(keys.STRATEGY_TO_RESHARD[raw]).lower()}`, "
                        "or `fsdp-tune convert --fsdp2`",
                    )
                )
                continue
            if target == "fsdp.sharding_strategy" and "fsdp.sharding_strategy" in final:
                continue  # an explicit sharding_strategy wins (accelerate reads only that one for FSDP1)
        try:
            values[target] = coerce(target, raw, method)
        except BadValue as e:
            hint = e.hint or value_hint(target, method)
            findings.append(Finding("FT010", Severity.ERROR, a.origin.key, a.origin.source, str(e), hint))
            continue
        origins[target] = a.origin

    if values.get("fsdp.version") is None:
        values.pop("fsdp.version", None)
    sections: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        kwargs = {p.split(".", 1)[1]: v for p, v in values.items() if p.startswith(name + ".") and v is not None}
        sections[name] = cls(**kwargs)
    training = {p.split(".", 1)[1]: v for p, v in values.items() if p.startswith("training.")}
    peft = PeftSettings({p.split(".", 1)[1]: v for p, v in values.items() if p.startswith("peft.") and v is not None})
    training_settings = TrainingSettings(training, sections["run"].method)
    cfg = RunConfig(**sections, training=training_settings, peft=peft, origins=origins, config_path=config_path)
    return _derive(cfg), findings + disagreements(assignments)


def _method(final: dict[str, Assignment]) -> str:
    """The training method asked for (its config decides how the training fields are read); SFT when none or
    an unknown one is given (that value is reported with the others)."""
    if "run.method" not in final:
        return SFT
    try:
        return coerce("run.method", final["run.method"].value)
    except BadValue:
        return SFT


def _derive(cfg: RunConfig) -> RunConfig:
    """Settings implied by others: FSDP1's strategy decides resharding; a model dtype the user named is also the
    4-bit compute dtype unless one is given (as TRL's get_quantization_config does for `--load_in_4bit --dtype`)."""
    fsdp = cfg.fsdp
    if fsdp.sharding_strategy and not cfg.is_set("fsdp.reshard_after_forward"):
        fsdp = replace(fsdp, reshard_after_forward=keys.STRATEGY_TO_RESHARD[fsdp.sharding_strategy])
    quant = cfg.quantization
    if cfg.model.dtype in FLOAT_DTYPES and not cfg.is_set("quantization.bnb_4bit_compute_dtype"):
        quant = replace(quant, bnb_4bit_compute_dtype=cfg.model.dtype)
    return replace(cfg, fsdp=fsdp, quantization=quant)
