"""`fsdp-tune plan` against the figures PEFT's FSDP guide published for its two seed launches.

No training: the plan of each seed launch (as `scripts/run_peft_*.sh` passes it) next to the measured figure.
Source: PEFT docs, "Fully Sharded Data Parallel" (docs/source/accelerate/fsdp.md): Llama-2-70B LoRA on
8x H100 80GB, 72-80 GB per GPU; QLoRA on 2 GPUs, 19.6 GB per GPU and about 107 GB host RAM with CPU offload,
35.6 GB per GPU without. Figures read as GiB (nvidia-smi reports MiB).
"""

from __future__ import annotations

from benchmarks.seeds import REPO, seed_flags

SCENARIOS = [
    # (label, seed script, extra flags, plan key, published low, published high)
    ("70B LoRA, 8 GPUs: per GPU", "run_peft_fsdp.sh", [], "per_gpu_memory_gib", 72.0, 80.0),
    (
        "70B QLoRA, 2 GPUs, no offload: per GPU",
        "run_peft_qlora_fsdp.sh",
        ["--fsdp_offload_params", "false"],
        "per_gpu_memory_gib",
        35.6,
        35.6,
    ),
    ("70B QLoRA, 2 GPUs, offload: per GPU", "run_peft_qlora_fsdp.sh", [], "per_gpu_memory_gib", 19.6, 19.6),
    ("70B QLoRA, 2 GPUs, offload: host (peak)", "run_peft_qlora_fsdp.sh", [], "host_memory_gib_per_node", 107, 107),
    (
        "70B QLoRA, 2 GPUs, offload: host (steady)",
        "run_peft_qlora_fsdp.sh",
        [],
        "host_memory_gib_per_node_steady",
        107,
        107,
    ),
]


def run() -> dict:
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.validate import check

    rows = []
    for label, script, extra, key, low, high in SCENARIOS:
        config, flags = seed_flags(script)
        planned = memory_plan(check(str(REPO / config), [*flags, *extra]).config)[key]
        nearest = min(max(planned, low), high)  # a published range counts as exact anywhere inside it
        error = (planned - nearest) / nearest
        rows.append({"scenario": label, "planned_gib": planned, "published": [low, high], "error": round(error, 3)})
    return {"rows": rows, "tolerance": 0.15}
