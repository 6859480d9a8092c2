"""`fsdp-tune train`: validate, resolve resume, plan, pre-flight, then launch (or just print with --dry_run)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fsdp_tune.checkpoints import latest_complete
from fsdp_tune.config import Checked, load
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, PreflightError, Severity, UsageError
from fsdp_tune.plan import LaunchPlan, make_plan
from fsdp_tune.rules.quant import compute_precision, model_dtype, quant_storage

Echo = Callable[[str], None]


def resolve_resume(cfg: RunConfig, echo: Echo) -> str | None:
    wanted = cfg.training.get("resume_from_checkpoint")
    if not wanted:
        return None
    output_dir = cfg.training.get("output_dir") or ""
    if str(wanted).lower() == "latest":
        best, skipped = latest_complete(output_dir)
        for c in skipped:
            echo(f"warning: skipping incomplete checkpoint {c.path} (no completion marker; left in place)")
        if best is None:
            echo(f"note: no complete checkpoint in {output_dir}: starting from step 0")
            return None
        echo(f"resuming from {best.path} (step {best.step})")
        return str(best.path.resolve())
    path = Path(str(wanted)).expanduser()
    if not path.is_dir():
        raise UsageError(
            f"--resume_from_checkpoint {wanted}: no such checkpoint folder",
            "--resume_from_checkpoint latest picks the newest complete one in --output_dir",
        )
    return str(path.resolve())


def describe(cfg: RunConfig, plan: LaunchPlan) -> str:
    f = cfg.fsdp
    device = "CPU, gloo" if plan.on_cpu else "GPU, nccl"
    wrap = f.auto_wrap_policy + (
        f" ({','.join(f.transformer_layer_cls_to_wrap)})"
        if f.transformer_layer_cls_to_wrap
        else " (the model's decoder layers)"
    )
    offload_note = " (no effect on CPU: off)" if f.cpu_offload and plan.on_cpu else ""
    lines = [
        f"plan: {plan.world_size} rank{'s' if plan.world_size > 1 else ''} on {plan.nnodes} machine"
        f"{'s' if plan.nnodes > 1 else ''} ({plan.nproc_per_node} per machine, this is machine {plan.node_rank}), "
        f"{device}",
        "  torchrun: " + " ".join(plan.command()),
        f"  fsdp: FSDP{f.version}, reshard_after_forward={str(f.reshard_after_forward).lower()}, "
        f"cpu_offload={str(f.cpu_offload).lower()}{offload_note}, wrap {wrap}",
        f"  checkpoints: {f.state_dict_type}; final adapter: full state dict, loadable without FSDP",
        f"  precision: {compute_precision(cfg)}, model loaded in {model_dtype(cfg)}; "
        f"activation checkpointing: {'FSDP' if f.activation_checkpointing else 'off'}, "
        f"gradient checkpointing: {'on' if plan.gradient_checkpointing else 'off'}",
    ]
    if cfg.lora.use_peft_lora:
        lo = cfg.lora
        lines.append(
            f"  {'DoRA' if lo.use_dora else 'LoRA'}: r={lo.lora_r} alpha={lo.lora_alpha:g} "
            f"dropout={lo.lora_dropout:g} targets={','.join(lo.lora_target_modules)}"
        )
    if cfg.quantization.use_4bit_quantization:
        q = cfg.quantization
        lines.append(
            f"  QLoRA: 4-bit {q.bnb_4bit_quant_type}, storage {quant_storage(cfg)}, compute "
            f"{q.bnb_4bit_compute_dtype}, nested={str(q.use_nested_quant).lower()}"
        )
    lines.append(
        f"  model: {cfg.model.model_name_or_path}   data: {cfg.data.dataset_name} (splits {','.join(cfg.data.splits)})"
    )
    if plan.env:
        lines.append("  env (as accelerate launch sets it): " + " ".join(f"{k}={v}" for k, v in plan.env.items()))
    lines.append(
        f"  output: {plan.output_dir}"
        + (f"   resume: {plan.resume_from_checkpoint}" if plan.resume_from_checkpoint else "")
    )
    return "\n".join(lines)


def plan_run(config: str | None, argv: list[str], echo: Echo) -> tuple[Checked, LaunchPlan, list[Finding]]:
    from fsdp_tune.preflight import check_machine

    checked = load(config, argv)
    cfg = checked.config
    resume = resolve_resume(cfg, echo)
    plan = make_plan(cfg, resume)
    machine = check_machine(cfg, plan, resume_requested=bool(cfg.training.get("resume_from_checkpoint")))
    return checked, plan, machine


def preflight_error(findings: list[Finding]) -> PreflightError | None:
    errors = [f for f in findings if f.severity is Severity.ERROR]
    return PreflightError(errors) if errors else None
