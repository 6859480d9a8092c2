"""Text for people: findings in the house error voice, and the resolved settings as a table."""

from __future__ import annotations

from typing import Any

from fsdp_tune.config import Checked
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, Severity

# What a reader of `validate-config` needs first; the rest is in --json.
SUMMARY_KEYS = {
    "launch": (
        "num_processes",
        "num_machines",
        "machine_rank",
        "main_process_ip",
        "main_process_port",
        "rdzv_backend",
        "mixed_precision",
        "use_cpu",
    ),
    "fsdp": (
        "version",
        "reshard_after_forward",
        "cpu_offload",
        "auto_wrap_policy",
        "transformer_layer_cls_to_wrap",
        "min_num_params",
        "state_dict_type",
        "cpu_ram_efficient_loading",
        "activation_checkpointing",
        "sharding_strategy",
    ),
    "model": ("model_name_or_path", "use_flash_attn", "dtype"),
    "data": ("dataset_name", "splits", "chat_template_format", "max_seq_len", "packing", "dataset_text_field"),
    "lora": ("use_peft_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "use_dora"),
    "quantization": (
        "use_4bit_quantization",
        "use_8bit_quantization",
        "use_nested_quant",
        "bnb_4bit_quant_type",
        "bnb_4bit_compute_dtype",
        "bnb_4bit_quant_storage_dtype",
    ),
}


def format_finding(f: Finding, style=lambda text, **_: text) -> str:
    colour = {"error": "red", "warning": "yellow", "note": "cyan"}[f.severity.value]
    key = f"{f.key} ({f.source})" if f.source not in ("command line", "default") else f.key
    lines = [f"  {style(f.rule, fg=colour, bold=True)} {key}: {f.message}"]
    if f.hint:
        lines.append(f"        hint: {f.hint}")
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


def _show(value: Any) -> str:
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
            rows.append((path, _show(getattr(obj, name)), origin.source if origin else "default"))
    for name, value in sorted(cfg.training.args.items()):
        origin = cfg.origin(f"training.{name}")
        rows.append((f"training.{name}", _show(value), origin.source if origin else ""))
    width = max(len(r[0]) for r in rows)
    vwidth = min(max(len(r[1]) for r in rows), 40)
    return "\n".join(f"  {p:<{width}}  {v:<{vwidth}}  {s}" for p, v, s in rows)


def checked_as_json(checked: Checked) -> dict[str, Any]:
    return {
        "valid": not checked.errors,
        "format": checked.format,
        "config": checked.config.as_dict(),
        "sources": {p: {"key": o.key, "source": o.source} for p, o in checked.config.origins.items()},
        "findings": [f.as_dict() for f in checked.findings],
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The few lines a user reads after a run."""
    first, last = summary.get("loss_first"), summary.get("loss_last")
    loss = (
        f"{first:.3f} -> {last:.3f}" if first is not None and last is not None else "not logged (logging_steps > steps)"
    )
    tps = summary.get("tokens_per_s")
    ranks = ", ".join(f"rank {i}: {r['peak_rss_mib']:.0f} MiB" for i, r in enumerate(summary.get("per_rank", [])))
    units = ", ".join(f"{n} x {k}" for k, n in summary.get("fsdp_units", {}).items())
    lines = [
        "done: "
        + f"{summary['steps']} steps in {summary['train_runtime_s']:.1f} s, loss {loss}"
        + (f", {tps:.0f} tokens/s" if tps else ""),
        f"  peak memory (RSS): {ranks}",
        f"  FSDP units: {units or '-'}",
    ]
    grew = summary.get("vocab_grew")
    if grew:
        lines.append(
            f"  vocabulary: {grew['from']} -> {grew['tokenizer']} tokens (the chat template's); the adapter carries "
            f"the embedding layers ({grew['rows']} rows): load it onto a base resized with "
            "resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8) (fsdp-tune merge does)"
        )
    cut = summary.get("truncated_sequences") or {}
    if cut.get("cut"):
        lines.append(f"  data: {cut['cut']} of {cut['total']} sequences were cut at max_seq_len {cut['max_seq_len']}")
    gpu = [r for r in summary.get("per_rank", []) if "peak_gpu_reserved_mib" in r]
    if gpu:
        lines.append("  peak GPU reserved: " + ", ".join(f"{r['peak_gpu_reserved_mib']:.0f} MiB" for r in gpu))
    check = summary.get("adapter_check")
    if check:
        lines.append(f"  adapter: {summary['adapter_dir']} ({check['lora_tensors']} LoRA tensors, whole, trained)")
    else:
        lines.append(f"  saved to: {summary['adapter_dir']}")
    return "\n".join(lines)


def format_plan(plan: dict[str, Any]) -> str:
    m = plan["model"]
    lines = [
        f"model: {m['name']} ({plan['total_params'] / 1e9:.2f}B parameters, {m['layers']} x {m['layer_class']}); "
        f"trainable {plan['trainable_params'] / 1e6:.1f}M; {plan['world_size']} ranks on {plan['device']}"
    ]
    if plan["per_gpu_memory_gib"] is not None:
        verdict = "fits" if plan["fits"] else "does NOT fit"
        lines.append(
            f"per-GPU memory: {plan['per_gpu_memory_gib']:.1f} GiB of {plan['gpu_memory_gib']:.1f} GiB: {verdict}"
        )
    else:
        lines.append(f"per-rank peak host memory (CPU run): {plan['per_rank_host_peak_gib']:.2f} GiB")
    for name, gib in plan["components"].items():
        if gib:
            lines.append(f"  {name:<46} {gib:8.2f} GiB")
    host = f"host memory per node: {plan['host_memory_gib_per_node']:.1f} GiB at peak"
    if plan["host_memory_gib_per_node_steady"] < plan["host_memory_gib_per_node"] - 0.05:
        host += f", {plan['host_memory_gib_per_node_steady']:.1f} GiB once training runs"
    lines.append(host + " (the larger of the loading and training phases)")
    for name, gib in plan["host_components"].items():
        if gib:
            lines.append(f"  {name:<46} {gib:8.2f} GiB")
    st = plan.get("step_time")
    if st:
        lines.append(
            f"step: {st['tflops_per_step_per_gpu']:.0f} TFLOP and {st['comm_gb_per_step_per_gpu']:.1f} GB of "
            f"all-gather per GPU"
            + (
                f", {st['host_transfer_gb_per_step_per_gpu']:.1f} GB host<->GPU (offload)"
                if st["host_transfer_gb_per_step_per_gpu"]
                else ""
            )
            + f" -> ~{st['step_s']:.2f} s ({st['bound']}-bound, at {st['assumed_mfu']:.0%} of "
            f"peak), ~{st['tokens_per_s_per_gpu']:.0f} tokens/s per GPU"
        )
    for note in plan.get("notes", []):
        lines.append(f"note: {note}")
    if plan["advice"]:
        lines.append("cheapest changes that make it fit:")
        for a in plan["advice"]:
            lines.append(f"  - {a['change']}: {a['per_gpu_memory_gib']:.1f} GiB")
    elif plan["per_gpu_memory_gib"] is not None and not plan["fits"]:
        lines.append("no single change makes it fit: combine them, or use more GPUs")
    return "\n".join(lines)
