"""The analytic planner held to the trace (`fsdp-tune plan --trace`) over the sizes users run: Llama-3-8B,
Llama-2-70B and Llama-3.1-405B shapes; 8, 64 and 512 ranks; LoRA and QLoRA (r 16, all linear layers); micro-batch
2 x 2048 and 1 x 512; with and without CPU offload; HSDP (8-way shards, replicated across the rest). Each case: the
plan's step peak (allocated, not the loading phase) against the traced one, the step's FLOPs and all-gather bytes,
and the trace's wall time.

`python -m benchmarks trace` runs the whole grid (about 25 s a case on 2 busy cores); `python -m benchmarks trace
--ci` and tests/lib/test_trace_grid.py the CI subset (CI_CASES); FSDP_TUNE_TRACE_GRID=full makes the test run the
whole grid.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

TOLERANCE = 0.05  # the plan's step peak within 5% of the trace's
MODELS = {"8b": "meta-llama/Meta-Llama-3-8B", "70b": "meta-llama/Llama-2-70b-hf", "405b": "meta-llama/Llama-3.1-405B"}
WORLDS = (8, 64, 512)
BATCHES = {"2x2048": (2, 2048), "1x512": (1, 512)}
HSDP_SHARD = 8


@dataclass(frozen=True)
class Case:
    model: str  # a MODELS key
    world: int
    qlora: bool
    batch: str  # a BATCHES key
    offload: bool = False
    hsdp: bool = False
    method: str = "sft"  # dpo, kto: the preference step (its no-grad forwards, DPO's chosen and rejected rows)

    @property
    def id(self) -> str:
        parts = [self.model, f"{self.world}r", "qlora" if self.qlora else "lora", self.batch]
        parts += (["offload"] if self.offload else []) + (["hsdp"] if self.hsdp else [])
        return "-".join(parts + ([self.method] if self.method != "sft" else []))

    def flags(self) -> list[str]:
        micro, seq = BATCHES[self.batch]
        flags = [
            "--model_name_or_path", MODELS[self.model],
            "--num_processes", str(self.world),
            "--num_machines", str(max(1, self.world // 8)),
            "--use_peft_lora", "True", "--lora_r", "16", "--lora_target_modules", "all-linear",
            "--per_device_train_batch_size", str(micro), "--max_seq_len", str(seq), "--bf16", "True",
            "--fsdp_offload_params", str(self.offload).lower(), "--method", self.method,
        ]  # fmt: skip
        if self.qlora:
            flags += ["--use_4bit_quantization", "True", "--use_nested_quant", "True"]
            flags += ["--bnb_4bit_compute_dtype", "bfloat16", "--bnb_4bit_quant_storage_dtype", "bfloat16"]
        if self.hsdp:
            flags += ["--use_parallelism_config", "true", "--parallelism_config_dp_shard_size", str(HSDP_SHARD)]
            flags += ["--parallelism_config_dp_replicate_size", str(self.world // HSDP_SHARD)]
        return flags


def grid() -> list[Case]:
    cases = [
        Case(m, w, q, b, o)
        for m, w, q, b, o in itertools.product(MODELS, WORLDS, (False, True), BATCHES, (False, True))
    ]
    cases += [Case(m, w, q, "2x2048", hsdp=True) for m, w, q in itertools.product(MODELS, (64, 512), (False, True))]
    preference = itertools.product(MODELS, (8, 64), (False, True), BATCHES, ("dpo", "kto"))
    cases += [Case(m, w, q, b, method=method) for m, w, q, b, method in preference]
    return cases


# The CI subset: each model, world size, adapter kind, micro-batch, offload and HSDP at least once, and each place
# the peak sits: the last layer's backward (long sequences), with a 4-bit backward's dequantized weight (QLoRA, short
# ones), the last layer's forward all-gather copy-out (large layers, short sequences), the embedding's forward
CI_CASES = (
    Case("8b", 8, False, "2x2048"),
    Case("70b", 64, True, "1x512", offload=True),
    Case("405b", 512, False, "1x512"),
    Case("405b", 64, True, "1x512"),
    Case("8b", 64, True, "2x2048", hsdp=True),
    Case("8b", 8, False, "2x2048", method="dpo"),  # the reference forward beside the policy's 2B rows
    Case("70b", 64, True, "1x512", method="kto"),  # KTO's three no-grad forwards; their peak in a layer
)
# Collective bytes: within 2% of the trace for SFT; for DPO and KTO within 4%: with 4-bit weights the trace moves
# 0.6-3.6% more in all than the plan (one forward's all-gathers per no-grad forward) on the grid's 24 QLoRA cases,
# which is not explained or modelled yet; with 16-bit weights they agree within 1.3%
COMM_TOLERANCE = {"sft": 0.02, "dpo": 0.04, "kto": 0.04}


def config(case: Case):
    from fsdp_tune.validate import check

    return check(str(Path(__file__).resolve().parents[1] / "configs" / "fsdp2.json"), case.flags()).config


def compare(case: Case) -> dict:
    """One row: the plan against the trace."""
    from fsdp_tune.output.trace import compare as against
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.trace.run import trace

    cfg = config(case)
    started = time.time()
    traced = trace(cfg)
    wall = time.time() - started
    plan = memory_plan(cfg, "h100")
    c = against(plan, traced)
    return {
        "id": case.id,
        "plan_gib": c["plan_peak_allocated_gib"],
        "trace_gib": traced["peak_allocated_gib"],
        "error": c["peak_difference"],
        "plan_phase": plan["peak_phase"],
        "trace_phase": traced["peak_phase"],
        "plan_tflops": c["plan_tflops_per_step"],
        "trace_tflops": traced["tflops_per_step"],
        "plan_comm_gb": c["plan_comm_gb_per_step"],
        "trace_comm_gb": round(sum(traced["comm_gb_per_step"].values()), 2),
        "trace_wall_s": round(wall, 1),
        "trace_world_size": traced["world_size"],
        "trace_phases_gib": traced["phases_gib"],  # what a failing case shows (at the model's depth)
        "trace_notes": traced["notes"],
        "within": abs(c["peak_difference"]) <= TOLERANCE,
    }


def run(ci: bool = False, only: str | None = None) -> list[dict]:
    cases = CI_CASES if ci else grid()
    return [compare(c) for c in cases if only is None or only in c.id]


def as_markdown(rows: list[dict]) -> str:
    out = [
        "| case | plan GiB | trace GiB | plan | peak (trace) | TFLOP plan / trace | comm GB plan / trace | trace s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['id']} | {r['plan_gib']:.2f} | {r['trace_gib']:.2f} | {r['error']:+.1%} | {r['trace_phase']} | "
            f"{r['plan_tflops']:.0f} / {r['trace_tflops']:.0f} | {r['plan_comm_gb']:.1f} / {r['trace_comm_gb']:.1f} "
            f"| {r['trace_wall_s']:.0f} |"
        )
    return "\n".join(out)
