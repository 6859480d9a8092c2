"""Text for people, in one place: findings in the house error voice, the resolved settings, the launch
plan, the run summary, the memory plan, the runs report and the environment report."""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.launch import loading
from fsdp_tune.launch.spec import RankSpec
from fsdp_tune.summary import RunSummary

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


def checked_as_json(checked) -> dict[str, Any]:
    return {
        "valid": not checked.errors,
        "format": checked.format,
        "config": checked.config.as_dict(),
        "sources": {p: {"key": o.key, "source": o.source} for p, o in checked.config.origins.items()},
        "findings": [f.as_dict() for f in checked.findings],
    }


def format_summary(s: RunSummary) -> str:
    """The few lines a user reads after a run."""
    loss = (
        f"{s.loss_first:.3f} -> {s.loss_last:.3f}"
        if s.loss_first is not None and s.loss_last is not None
        else "not logged (logging_steps > steps)"
    )
    ranks = ", ".join(f"rank {i}: {r.peak_rss_mib:.0f} MiB" for i, r in enumerate(s.per_rank))
    units = ", ".join(f"{n} x {k}" for k, n in s.fsdp_units.items())
    lines = [
        f"done: {s.steps} steps in {s.train_runtime_s:.1f} s, loss {loss}"
        + (f", {s.tokens_per_s:.0f} tokens/s" if s.tokens_per_s else ""),
        f"  peak memory (RSS): {ranks}",
        f"  FSDP units: {units or '-'}",
    ]
    if s.mesh:
        lines.append("  device mesh: " + " x ".join(f"{k} {v}" for k, v in s.mesh.items()))
    grew = s.vocab_grew
    if grew:
        lines.append(
            f"  vocabulary: {grew['from']} -> {grew['tokenizer']} tokens (the chat template's); the adapter carries "
            f"the embedding layers ({grew['rows']} rows): load it onto a base resized with "
            "resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8) (fsdp-tune merge does)"
        )
    cut = s.truncated_sequences or {}
    if cut.get("cut"):
        lines.append(f"  data: {cut['cut']} of {cut['total']} sequences were cut at max_seq_len {cut['max_seq_len']}")
    gpu = [r for r in s.per_rank if r.peak_gpu_reserved_mib is not None]
    if gpu:
        lines.append("  peak GPU reserved: " + ", ".join(f"{r.peak_gpu_reserved_mib:.0f} MiB" for r in gpu))
    if s.adapter_check:
        lines.append(f"  adapter: {s.adapter_dir} ({s.adapter_check['lora_tensors']} LoRA tensors, whole, trained)")
    else:
        lines.append(f"  saved to: {s.adapter_dir}")
    return "\n".join(lines)


def format_plan(plan: dict[str, Any]) -> str:
    m = plan["model"]
    lines = [
        f"model: {m['name']} ({plan['total_params'] / 1e9:.2f}B parameters, {m['layers']} x {m['layer_class']}); "
        f"trainable {plan['trainable_params'] / 1e6:.1f}M; {plan['world_size']} ranks on {plan['device']}"
    ]
    if plan["per_gpu_memory_gib"] is not None:
        verdict = (
            ("fits, at the card's capacity" if plan.get("at_capacity") else "fits") if plan["fits"] else "does NOT fit"
        )
        low, high = plan["range_gib"]
        lines.append(
            f"per-GPU memory: {plan['per_gpu_memory_gib']:.1f} GiB (range {low:.1f}-{high:.1f}) of "
            f"{plan['gpu_memory_gib']:.1f} GiB: {verdict}\n  peak allocated {plan['peak_allocated_gib']:.1f} GiB "
            f"({plan['peak_phase']}), reserved ~{plan['peak_reserved_gib']:.1f} GiB; the step's peak, "
            f"{plan['training_peak_gib']:.1f} GiB:"
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
    lines += [f"note: {n}" for n in plan.get("notes", [])] + [f"assumed: {a}" for a in plan.get("assumptions", [])]
    if plan["advice"]:
        lines.append("cheapest changes that make it fit:")
        for a in plan["advice"]:
            lines.append(f"  - {a['change']}: {a['per_gpu_memory_gib']:.1f} GiB")
    elif plan["per_gpu_memory_gib"] is not None and not plan["fits"]:
        lines.append("no single change makes it fit: combine them, or use more GPUs")
    return "\n".join(lines)


def format_rows(rows: list[dict]) -> str:
    """`fsdp-tune report`: runs side by side (peak memory is GPU reserved on GPU runs, RSS on CPU runs)."""

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    width = max(12, *(len(r["run"][-40:]) for r in rows))
    lines = [
        f"{'run':<{width}} {'status':<11} {'steps':>6} {'loss':>8} {'eval loss':>9} {'tok/s':>8} "
        f"{'1st step s':>10} {'time s':>8} {'peak MiB':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['run'][-40:]:<{width}} {r['status']:<11} {r['steps']:>6} {f(r['loss_last'], '.4f'):>8} "
            f"{f(r['eval_loss_last'], '.4f'):>9} {f(r['tokens_per_s'], '.0f'):>8} "
            f"{f(r['time_to_first_step_s'], '.1f'):>10} {f(r['train_runtime_s'], '.1f'):>8} "
            f"{f(r['peak_memory_mib'], '.0f'):>9}"
        )
    return "\n".join(lines)


def format_info(info: dict) -> str:
    lines = [f"{k:<22} {v}" for k, v in info["versions"].items()]
    for key in (
        "platform",
        "cpu_count",
        "ram_gib",
        "cuda_available",
        "cuda_version",
        "nccl_available",
        "gloo_available",
        "bitsandbytes_backend",
        "flash_attn_installed",
    ):
        lines.append(f"{key:<22} {info.get(key)}")
    for i, gpu in enumerate(info.get("gpus") or []):
        lines.append(f"gpu {i:<18} {gpu['name']}, {gpu['memory_gib']} GiB, bf16={gpu['bf16']}")
    return "\n".join(lines)


def describe_launch(cfg: RunConfig, spec: RankSpec, command: list[str]) -> str:
    """The plan `train` prints before launching (and `--dry_run` alone): what every rank will execute."""
    w, f = spec.world, spec.unit_fsdp_config  # under sharded loading fsdp-tune makes the units accelerate would
    wrap = f["auto_wrap_policy"] + (
        f" ({','.join(f['transformer_layer_cls_to_wrap'])})"
        if f.get("transformer_layer_cls_to_wrap")
        else " (the model's decoder layers)"
        if f["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        else ""
    )
    lines = [
        f"plan: {w.world_size} rank{'s' if w.world_size > 1 else ''} on {w.nnodes} machine"
        f"{'s' if w.nnodes > 1 else ''} ({w.nproc_per_node} per machine, this is machine {w.node_rank}), "
        f"{spec.device.upper() if spec.device == 'cpu' else 'GPU'}, {spec.backend}",
        "  torchrun: " + " ".join(command),
        f"  fsdp: FSDP{spec.fsdp_version}, reshard_after_forward={_show(f['reshard_after_forward'])}, "
        f"cpu_offload={_show(f['cpu_offload'])}, wrap {wrap}",
    ]
    if spec.parallelism:
        sizes = {k.removesuffix("_size"): v for k, v in spec.parallelism.items() if k.endswith("_size") and v > 1}
        lines.append("  device mesh: " + " x ".join(f"{k} {v}" for k, v in sizes.items()))
    lines += [
        f"  checkpoints: {f['state_dict_type']}; final adapter: full state dict, loadable without FSDP",
        f"  precision: {spec.precision}, model loaded in {spec.model.dtype}, "
        f"attention {spec.model.attn_implementation}; checkpointing: {_CHECKPOINTING[spec.checkpointing]}",
    ]
    if spec.lora:
        lo = spec.lora
        targets = lo["target_modules"] if isinstance(lo["target_modules"], str) else ",".join(lo["target_modules"])
        lines.append(
            f"  {'DoRA' if lo['use_dora'] else 'LoRA'}: r={lo['r']} alpha={lo['lora_alpha']:g} "
            f"dropout={lo['lora_dropout']:g} targets={targets}"
        )
    q = spec.model.quantization
    if q:
        lines.append(
            f"  QLoRA: 4-bit {q['bnb_4bit_quant_type']}, storage {q['bnb_4bit_quant_storage']}, compute "
            f"{q['bnb_4bit_compute_dtype']}, nested={_show(q['bnb_4bit_use_double_quant'])}"
        )
    d = spec.data
    lines.append(f"  model: {cfg.model.model_name_or_path}   data: {d.dataset_name} (splits {','.join(d.splits)})")
    lines.append(f"  loading: {loading.describe(spec.model.loading, spec.model.loading_note)}")
    lines.append("  rank env: " + " ".join(f"{k}={v}" for k, v in spec.env.items()))
    lines.append(
        f"  output: {spec.output_dir}"
        + (f"   resume: {spec.resume_from_checkpoint}" if spec.resume_from_checkpoint else "")
    )
    lines += [f"  note: {n}" for n in spec.notes]
    return "\n".join(lines)


_CHECKPOINTING = {
    "fsdp": "FSDP activation checkpointing",
    "gradient": "the Trainer's gradient checkpointing",
    "off": "off",
}
