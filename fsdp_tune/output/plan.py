"""The memory plan (`fsdp-tune plan`, and the dry run's memory summary)."""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.methods import SFT, row_of
from fsdp_tune.planner import experts
from fsdp_tune.planner.generating import GENERATION, LOG_PROBS

METHOD_PHASES = (GENERATION, LOG_PROBS)  # phases before the training step (GRPO's), said even off the peak


def vision_lines(plan: dict[str, Any]) -> list[str]:
    """A vision-language model's tower and an image's patches and tokens (planner/vision.py)."""
    v = plan.get("vision")
    if not v:
        return []
    image = v["image"]
    return [
        f"vision: {v['family']}, tower and projector {v['tower_and_projector_params'] / 1e6:.1f}M parameters "
        f"({v['tower_blocks']} blocks; tower {v['tower']}, projector {v['projector']}); a {image['width']}x"
        f"{image['height']} image{' (assumed)' if image['assumed'] else ''}: {v['patches_per_image']} patches, "
        f"{v['tokens_per_image']} tokens"
    ]


def format_plan(plan: dict[str, Any]) -> str:
    m = plan["model"]
    method = plan.get("method", SFT)
    lines = [f"method: {row_of(method).title}"] if row_of(method).named else []
    lines += [
        f"model: {m['name']} ({plan['total_params'] / 1e9:.2f}B parameters, {m['layers']} x {m['layer_class']}); "
        f"trainable {plan['trainable_params'] / 1e6:.1f}M; {plan['world_size']} ranks on {plan['device']}"
    ]
    lines += vision_lines(plan)
    if plan["per_gpu_memory_gib"] is not None:
        low, high = plan["range_gib"]
        lines.append(
            f"per-GPU memory: needs {low:.1f}-{high:.1f} GiB (likely {plan['per_gpu_memory_gib']:.1f}) of "
            f"{plan['gpu_memory_gib']:.1f} GiB: {_verdict(plan)}\n"
            f"  peak allocated {plan['peak_allocated_gib']:.1f} GiB ({plan['peak_phase']}), "
            f"reserved ~{plan['peak_reserved_gib']:.1f} GiB; the step's peak, "
            f"{plan['training_peak_gib']:.1f} GiB:"
        )
    else:
        lines.append(f"per-rank peak host memory (CPU run): {plan['per_rank_host_peak_gib']:.2f} GiB")
    for name, gib in plan["components"].items():
        if gib:
            lines.append(f"  {name:<46} {gib:8.2f} GiB")
    phases = plan.get("phases_gib") or {}
    for name in METHOD_PHASES:
        if name in phases and name != plan.get("peak_phase"):
            lines.append(f"  {name}: {phases[name]:.2f} GiB")
    gen = plan.get("grpo_generation")
    if gen:  # planner/generating.py generation_weights
        how = "gathered once per generation" if gen["weights"] == "gathered" else "sharded (units gathered per token)"
        lines.append(f"generation weights: {how}: {gen['why']}")
    host = f"host memory per node: {plan['host_memory_gib_per_node']:.1f} GiB at peak"
    if plan["host_memory_gib_per_node_steady"] < plan["host_memory_gib_per_node"] - 0.05:
        host += f", {plan['host_memory_gib_per_node_steady']:.1f} GiB once training runs"
    host += " (the larger of the loading and training phases)"
    if plan.get("host_ram_gib") is not None:
        verdict = "fits" if plan["host_fits"] else "does NOT fit"
        host += f"; {plan['host_ram_gib']:.1f} GiB available on this machine: {verdict}"
    lines.append(host)
    for name, gib in plan["host_components"].items():
        if gib:
            lines.append(f"  {name:<46} {gib:8.2f} GiB")
    if plan.get("expert_parallel"):
        lines.append(experts.describe(plan["expert_parallel"]))
    lines += _step_line(plan.get("step_time"))
    lines += [f"note: {n}" for n in plan.get("notes", [])] + [f"assumed: {a}" for a in plan.get("assumptions", [])]
    return "\n".join(lines + _advice(plan))


def _step_line(st: dict[str, Any] | None) -> list[str]:
    """The step time's line: FLOPs, collectives (the context-parallel ring's share), host transfers, the time."""
    if not st:
        return []
    ring = st.get("ring_gb_per_step_per_gpu")
    host = st["host_transfer_gb_per_step_per_gpu"]
    return [
        f"step: {st['tflops_per_step_per_gpu']:.0f} TFLOP and {st['comm_gb_per_step_per_gpu']:.1f} GB of "
        f"all-gather per GPU"
        + (f" ({ring:.1f} GB of it the context-parallel K/V ring)" if ring else "")
        + (f", {host:.1f} GB host<->GPU (offload)" if host else "")
        + f" -> ~{st['step_s']:.2f} s ({st['bound']}-bound, at {st['assumed_mfu']:.0%} of "
        f"peak), ~{st['tokens_per_s_per_gpu']:.0f} tokens/s per GPU"
    ]


def _verdict(plan: dict[str, Any]) -> str:
    """Plain words on what the range means for the card: the allocated peak and the CUDA context must fit (the
    allocator frees its cache before it fails); the rest of the range is cache it may or may not keep."""
    low, high = plan["range_gib"]
    if not plan["fits"]:
        return f"does NOT fit (the allocated peak and CUDA context alone take {low:.1f} GiB)"
    if plan.get("at_capacity"):
        return (
            f"fits only if the allocator's cache stays under {plan['gpu_memory_gib'] - low:.1f} GiB (the allocated "
            f"peak and CUDA context take {low:.1f} GiB)"
        )
    return "fits, with room for the allocator's cache"


def _advice(plan: dict[str, Any]) -> list[str]:
    """The options the planner found, one line each: its step time, its memory, what else it changes, and last
    (to copy to the end of the line) the flags to add."""
    launch_fits = plan["fits"] and plan.get("host_fits") is not False
    if plan["per_gpu_memory_gib"] is None or (launch_fits and not plan.get("at_capacity")):
        return []
    if not plan["advice"]:
        if launch_fits:
            return []
        return [
            f"nothing fsdp-tune tried fits ({plan.get('advice_searched', 0)} variants: micro-batch and accumulation, "
            "checkpointing, offload, sharded loading, 2-4x the GPUs, QLoRA, half the sequence length): a larger card"
        ]
    head = "to leave the allocator room" if launch_fits else "does not fit as it stands; what fits"
    lines = [f"{head}, cheapest first by the planner's step time (add the flags to this command):"]
    for a in plan["advice"]:
        low, high = a["range_gib"]
        note = f"({a['note']})  " if a["note"] else ""
        room = " at capacity" if a["at_capacity"] else ""
        lines.append(f"  ~{a['step_s']:.1f} s/step  {low:.1f}-{high:.1f} GiB{room}  {note}{a['flags']}")
    return lines
