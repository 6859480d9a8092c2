"""`fsdp-tune plan` against every public measurement of FSDP fine-tuning memory we found
(benchmarks/data/public_memory.yaml), each planned as it was made: its model, settings and code path.

No training, no GPU: a few seconds. What is compared with what:
  peak_allocated -> the plan's peak allocated; peak_reserved -> allocated + FSDP's all-gather stream cache;
  nvidia-smi -> that + the CUDA context and NCCL (the plan's point); unknown (the source does not say
  which of these it read) -> the nearest end of [allocated, the range's top]. A figure at the card's
  capacity is a lower bound (a caching allocator fills what it has), so there the check is that the
  plan says it fits, not the number.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "public_memory.yaml"
TOLERANCE = 0.25  # the bar for figures not at capacity
PEFT_TOLERANCE = 0.15  # and for the PEFT guide's three figures


def load() -> list[dict[str, Any]]:
    import yaml

    return yaml.safe_load(DATA.read_text())


def config_of(entry: dict[str, Any]):
    """(RunConfig, Stack, loading) of a published run."""
    from fsdp_tune.config.schema import RunConfig, TrainingSettings
    from fsdp_tune.planner.stack import Stack

    p = entry["plan"]
    cfg = RunConfig()
    lora = p["train_type"] != "full"
    quant = p["train_type"] == "qlora"
    cfg = replace(
        cfg,
        launch=replace(
            cfg.launch,
            num_processes=p["shard_group"],
            num_machines=max(1, p["shard_group"] // 8),
            mixed_precision="bf16",
        ),
        fsdp=replace(
            cfg.fsdp,
            version=p["stack"].get("fsdp_version", 2),
            cpu_offload=bool(p["cpu_offload"]),
            activation_checkpointing=p["stack"].get("checkpointing", "full") != "none",
        ),
        model=replace(cfg.model, model_name_or_path=p["model"], dtype="bfloat16"),
        data=replace(cfg.data, max_seq_len=int(p["seq_len"] or 2048)),
        lora=replace(
            cfg.lora,
            use_peft_lora=lora,
            lora_r=int(p["lora_r"] or 8),
            lora_target_modules=tuple(p["lora_targets"] or ()),
            lora_dropout=float(p["lora_dropout"]),
        ),
        quantization=replace(
            cfg.quantization,
            use_4bit_quantization=quant,
            use_nested_quant=bool(p["nested"]),
            bnb_4bit_compute_dtype="bfloat16",
            bnb_4bit_quant_storage_dtype="bfloat16" if quant else None,
        ),
        training=TrainingSettings({"per_device_train_batch_size": int(p["micro_batch"]), "bf16": True}),
    )
    return cfg, Stack(**p["stack"]), p.get("loading", "transformers")


def compare(entry: dict[str, Any]) -> dict[str, Any]:
    """One row of the table: planned, published, error, and the fits verdicts."""
    from fsdp_tune.planner.plan import memory_plan

    row = {"id": entry["id"], "published": entry["value_gib"], "measured": entry["measured"]}
    row.update(at_capacity=entry["at_capacity"], trained=entry["fits"], skip=entry["plan"].get("skip"))
    if row["skip"]:
        return row
    cfg, stack, loading = config_of(entry)
    card = entry["plan"].get("gpu_memory_gib") or entry["gpu_memory_gib"]
    plan = memory_plan(cfg, gpu_memory=f"{card}GiB" if card else None, loading=loading, stack=stack)
    allocated, point = plan["peak_allocated_gib"], plan["per_gpu_memory_gib"]
    planned = {
        "peak_allocated": allocated,
        "peak_reserved": plan["peak_reserved_gib"],
        "nvidia-smi": point,
    }.get(entry["measured"], min(max(entry["value_gib"], allocated), plan["range_gib"][1]))
    row.update(planned=round(planned, 2), range=plan["range_gib"], fits=plan["fits"], peak_phase=plan["peak_phase"])
    row["error"] = round((planned - entry["value_gib"]) / entry["value_gib"], 3)
    # for a figure of unknown kind the check is against the interval; the point's own error is shown beside it
    row["point"] = point if entry["measured"] == "unknown" else row["planned"]
    row["point_error"] = round((row["point"] - entry["value_gib"]) / entry["value_gib"], 3)
    row["verdict_ok"] = plan["fits"] == entry["fits"]
    row["within"] = row["at_capacity"] or abs(row["error"]) <= TOLERANCE
    return row


def run() -> dict:
    rows = [compare(e) for e in load()]
    planned = [r for r in rows if not r["skip"]]
    number = [r for r in planned if not r["at_capacity"]]
    errors = sorted(abs(r["error"]) for r in number)
    return {
        "rows": rows,
        "tolerance": TOLERANCE,
        "planned": len(planned),
        "not_at_capacity": len(number),
        "within_tolerance": sum(abs(r["error"]) <= TOLERANCE for r in number),
        "median_abs_error": errors[len(errors) // 2] if errors else None,
        "fits_verdicts_right": sum(r["verdict_ok"] for r in planned),
    }
