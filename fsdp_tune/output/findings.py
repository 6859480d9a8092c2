"""Findings in the house error voice, and the resolved settings as a table (validate-config: kept light)."""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.printable import printable
from fsdp_tune.redact import REDACTED, is_secret_key, redact, redact_text

# What a reader of `validate-config` needs first; the rest is in --json.
SUMMARY_KEYS = {
    "launch": "num_processes num_machines machine_rank main_process_ip main_process_port rdzv_backend "
    "mixed_precision use_cpu".split(),
    "fsdp": "version reshard_after_forward cpu_offload auto_wrap_policy transformer_layer_cls_to_wrap min_num_params "
    "state_dict_type cpu_ram_efficient_loading activation_checkpointing sharding_strategy".split(),
    "model": "model_name_or_path use_flash_attn dtype".split(),
    "data": "dataset_name splits chat_template_format max_seq_len packing dataset_text_field".split(),
    "lora": "use_peft_lora lora_r lora_alpha lora_dropout lora_target_modules use_dora".split(),
    "quantization": "use_4bit_quantization use_8bit_quantization use_nested_quant bnb_4bit_quant_type "
    "bnb_4bit_compute_dtype bnb_4bit_quant_storage_dtype".split(),
}


def format_finding(f: Finding, style=lambda text, **_: text) -> str:
    """One line, and its hint's: a newline inside a value (a file name, a row, a flag's value) is shown escaped,
    so no value draws a line of its own; the console door (output/console.py) escapes the other controls."""
    colour = {"error": "red", "warning": "yellow", "note": "cyan"}[f.severity.value]
    key, source, message, hint = (printable(x, keep="\t") for x in (f.key, f.source, f.message, f.hint))
    key = f"{key} ({source})" if source not in ("command line", "default") else key
    lines = [f"  {style(f.rule, fg=colour, bold=True)} {key}: {message}"]
    if hint:
        lines.append(f"        hint: {hint}")
    return "\n".join(lines)


def format_findings(subject: str, findings: list[Finding], style=lambda text, **_: text) -> str:
    errors = [f for f in findings if f.severity is Severity.ERROR]
    warnings = [f for f in findings if f.severity is Severity.WARNING]
    notes = [f for f in findings if f.severity is Severity.NOTE]
    out = []
    if errors:
        n = len(errors)
        out.append(
            style("error:", fg="red", bold=True)
            + f" {subject} is not a valid launch config ({n} problem{'s' if n > 1 else ''})"
        )
        out += [format_finding(f, style) for f in errors]
    if warnings:
        out.append(
            style("warning:", fg="yellow", bold=True) + f" {len(warnings)} warning{'s' if len(warnings) > 1 else ''}"
        )
        out += [format_finding(f, style) for f in warnings]
    if notes:
        out.append(style("note:", fg="cyan") + f" {len(notes)} note{'s' if len(notes) > 1 else ''}")
        out += [format_finding(f, style) for f in notes]
    return "\n".join(out)


def show(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value)) or "-"
    if value is None:
        return "-"
    return str(value).lower() if isinstance(value, bool) else str(value)


def format_settings(cfg: RunConfig) -> str:
    """One line per setting with where it came from, grouped by section."""
    rows: list[tuple[str, str, str]] = []
    for section, names in SUMMARY_KEYS.items():
        obj = getattr(cfg, section)
        for name in names:
            path = f"{section}.{name}"
            origin = cfg.origin(path)
            rows.append((path, show(getattr(obj, name)), origin.source if origin else "default"))
    for name, value in sorted(cfg.training.args.items()):
        origin = cfg.origin(f"training.{name}")
        rows.append(
            (f"training.{name}", REDACTED if is_secret_key(name) else show(value), origin.source if origin else "")
        )
    width = max(len(r[0]) for r in rows)
    vwidth = min(max(len(r[1]) for r in rows), 40)
    return "\n".join(f"  {p:<{width}}  {redact_text(v):<{vwidth}}  {s}" for p, v, s in rows)


def checked_as_json(checked) -> dict[str, Any]:
    return {
        "valid": not checked.errors,
        "format": checked.format,
        "config": redact(checked.config.as_dict()),
        "sources": {p: {"key": o.key, "source": o.source} for p, o in checked.config.origins.items()},
        "findings": [f.as_dict() for f in checked.findings],
    }
