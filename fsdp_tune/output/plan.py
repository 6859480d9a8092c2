"""The memory plan (`fsdp-tune plan`, and the dry run's memory summary)."""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.methods import TITLE


def format_plan(plan: dict[str, Any]) -> str:
    m = plan["model"]
    method = plan.get("method", "sft")
    lines = [] if method == "sft" else [f"method: {TITLE.get(method, method)}"]
    lines += [
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
