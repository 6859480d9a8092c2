"""`plan --trace`: the traced step beside the analytic plan, with the difference, and what the trace assumed and
cannot see."""

from __future__ import annotations

from typing import Any

ASSUMED = (
    "one step at the run's world size in fake mode (FakeTensorMode: shapes and dtypes, no storage) on a `cpu` fake "
    "device, a fake process group standing in for the other ranks; the model built from its config.json on the meta "
    "device as the ranks build it (the rank spec for a GPU machine)",
    "every sequence full length (no padding, every label trained); a warm-up step first, the second step measured",
    "CUDA-only kernels stood in by ops of the same live memory: TRL's Triton tile and fp32 accumulation, dropout's "
    "bool mask, bitsandbytes' 4-bit matmul (dequantize + linear past 1536 tokens, its fused kernel below); activation "
    "offload's save_on_cpu copies counted in host RAM (the copy back allocated on the device); transformers' SDPA "
    "mask skipped as it is for the rows' all-ones mask on real tensors (fake ones would build an S x S mask)",
)
CANNOT_SEE = (
    "CUDA kernel workspaces and algorithm choices, the caching allocator's reserve and fragmentation, the CUDA "
    "context and NCCL's buffers, data-dependent shapes (packing's lengths; MoE routing: grouped_mm runs every "
    "token's top-k rows whatever the routing), the loading phase",
)


def compare(plan: dict[str, Any], trace: dict[str, Any]) -> dict[str, Any]:
    """The plan's step figures against the trace's: the step's peak allocated (the plan's training peak, not its
    loading phase), FLOPs and all-gather bytes. Differences are the plan's, relative to the trace."""
    out = {
        "plan_peak_allocated_gib": plan.get("training_peak_gib"),
        "trace_peak_allocated_gib": trace["peak_allocated_gib"],
        "plan_peak_phase": plan.get("peak_phase"),
        "trace_peak_phase": trace["peak_phase"],
    }
    if out["plan_peak_allocated_gib"] is not None:
        out["peak_difference"] = _rel(out["plan_peak_allocated_gib"], trace["peak_allocated_gib"])
    st = plan.get("step_time")
    if st:
        out["plan_tflops_per_step"] = round(st["tflops_per_step_per_gpu"], 2)
        out["tflops_difference"] = _rel(st["tflops_per_step_per_gpu"], trace["tflops_per_step"])
        traced = sum(trace["comm_gb_per_step"].values())
        out["plan_comm_gb_per_step"] = round(st["comm_gb_per_step_per_gpu"], 3)
        out["comm_difference"] = _rel(st["comm_gb_per_step_per_gpu"], traced)
        ring = trace["comm_gb_per_step"].get(RING)
        if ring:  # context parallelism: the ring's K/V and dK/dV traffic, planned apart
            out["plan_ring_gb_per_step"] = round(st.get("ring_gb_per_step_per_gpu") or 0.0, 3)
            out["ring_difference"] = _rel(out["plan_ring_gb_per_step"], ring)
    host = trace.get("host_activations_gib")
    planned_host = plan.get("host_components", {}).get(OFFLOADED)
    if host and planned_host is not None:  # activation offload: per node in the plan, per rank in the trace
        out["plan_host_activations_gib"] = round(planned_host / max(trace.get("ranks_per_node") or 1, 1), 3)
        out["host_activations_difference"] = _rel(out["plan_host_activations_gib"], host)
    return out


RING = "context-parallel ring"  # trace/step.py Executed.RING
OFFLOADED = "training: checkpointed activations (save_on_cpu)"  # planner/memory.py's host component


def _rel(planned: float, traced: float) -> float | None:
    return round((planned - traced) / traced, 4) if traced else None


def format_trace(trace: dict[str, Any]) -> str:
    """The trace's lines, after the plan's."""
    c = trace["comparison"]
    depth = (
        f"{' and '.join(map(str, trace['layers_traced']))} of {trace['layers']} decoder layers traced, every phase "
        f"extrapolated linearly to {trace['layers']}"
        if trace["extrapolated"]
        else f"all {trace['layers']} decoder layers traced"
    )
    mesh = trace.get("mesh")
    lines = [
        f"trace: one step executed at {trace['world_size']} ranks"
        + (" (mesh " + " x ".join(f"{k} {v}" for k, v in mesh.items()) + ")" if mesh else "")
        + f" in fake mode on a cpu device; {depth}; {trace['wall_s']:.0f} s",
        f"  peak allocated {trace['peak_allocated_gib']:.2f} GiB ({trace['peak_phase']})",
    ]
    if c.get("peak_difference") is not None:
        lines[-1] += (
            f"; the plan's step peak {c['plan_peak_allocated_gib']:.2f} GiB ({c['plan_peak_phase']}): "
            f"plan {c['peak_difference']:+.1%}"
        )
    host = set(trace.get("host_categories") or [])
    for name, gib in trace["categories_gib"].items():
        if gib >= 0.005:
            lines.append(
                f"    {name:<44} {gib:8.2f} GiB" + (" (host memory, cpu_offload: not in the peak)" * (name in host))
            )
    comm = trace["comm_gb_per_step"]
    step = f"  step (per GPU): {trace['tflops_per_step']:.0f} TFLOP executed"
    if "plan_tflops_per_step" in c:
        step += f" (plan {c['plan_tflops_per_step']:.0f}, {c['tflops_difference']:+.1%})"
    step += "; " + ", ".join(f"{k} {v:.1f} GB" for k, v in comm.items() if v >= 0.05)
    if "plan_comm_gb_per_step" in c:
        step += f" (plan {c['plan_comm_gb_per_step']:.1f} GB in all, {c['comm_difference']:+.1%}"
        if "plan_ring_gb_per_step" in c:
            step += f"; the ring: plan {c['plan_ring_gb_per_step']:.1f} GB, {c['ring_difference']:+.1%}"
        step += ")"
    lines.append(step)
    if trace.get("host_activations_gib"):
        line = f"  host memory: {trace['host_activations_gib']:.2f} GiB of checkpointed activations (save_on_cpu)"
        if "plan_host_activations_gib" in c:
            line += f"; plan {c['plan_host_activations_gib']:.2f} GiB ({c['host_activations_difference']:+.1%})"
        lines.append(line + ", per rank")
    lines += [f"  note: {n}" for n in trace.get("notes", [])]
    lines += [f"  assumed: {a}" for a in ASSUMED]
    lines += [f"  cannot see: {n}" for n in CANNOT_SEE]
    return "\n".join(lines)
