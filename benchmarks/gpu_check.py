"""The GPU check: one prepared command for a lent GPU machine (scripts/gpu_check.sh runs it).

Every GPU path fsdp-tune decides by reading the libraries (launch/decide.py) is run here for a few steps:
LoRA and QLoRA under FSDP2 (sharded loading, the default: worker/sharded_load.py) and FSDP1 (from_pretrained),
with and without cpu_offload, QLoRA storage under another precision, QLoRA loaded through transformers as the
sharded pair's reference (same losses, its GPU peak before the first step beside sharded loading's), HSDP and
context parallelism where there are GPUs enough, and a CPU run on the GPU machine. Each scenario
ends with fsdp-tune's own adapter check; the table gives tokens/s, MFU, peak allocated/reserved next to
`fsdp-tune plan`'s prediction. Scenarios that need a package the machine lacks (trl, datasets,
bitsandbytes) are skipped by name; gpu_paths.py then checks the decisions underneath with torch, PEFT and
accelerate alone. `--cpu-smoke` runs the same path on CPU with the tiny model (CI runs it).
Results: benchmarks/results/gpu_check.json (gpu_check_cpu_smoke.json for the smoke run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "4090": 165.0, "L40S": 362.0}
QLORA = ["--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "bfloat16", "--use_nested_quant", "True"]


@dataclass(frozen=True)
class Scenario:
    name: str
    flags: tuple[str, ...]
    big: bool = False  # the 8B-class model (tokens/s, MFU); otherwise the 1B one
    needs: tuple[str, ...] = ("trl", "datasets")
    min_gpus: int = 1
    cpu_smoke: bool = False  # also in --cpu-smoke (the tiny model on CPU)
    same_as: str | None = None  # a scenario this one must train like (losses within GPU noise)


def scenarios(gpus: int) -> list[Scenario]:
    half = max(gpus // 2, 1)
    bnb = ("trl", "datasets", "bitsandbytes")
    return [
        Scenario("LoRA FSDP2", ("--bf16", "True"), big=True, cpu_smoke=True),
        Scenario("QLoRA FSDP2", (*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True"), True, bnb),
        Scenario(
            "QLoRA FSDP2, transformers loading",  # every FSDP2 LoRA/QLoRA scenario loads sharded (the default)
            (*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True", "--loading", "transformers"),
            True,
            bnb,
            same_as="QLoRA FSDP2",
        ),
        Scenario(
            "QLoRA FSDP2 + cpu_offload, sharded loading (the 2 x 24 GB path)",
            (*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True", "--fsdp_offload_params", "true"),
            needs=bnb,
        ),
        Scenario("LoRA FSDP2 + cpu_offload", ("--bf16", "True", "--fsdp_offload_params", "true")),
        Scenario(
            "QLoRA fp32 storage under bf16",
            (*QLORA, "--bnb_4bit_quant_storage_dtype", "float32", "--bf16", "True"),
            needs=bnb,
            cpu_smoke=True,
        ),
        Scenario("LoRA FSDP1", ("--bf16", "True", "--fsdp_version", "1")),
        Scenario(
            "QLoRA FSDP1 + cpu_offload (the seed's)",
            (*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True", "--fsdp_version", "1")
            + ("--fsdp_offload_params", "true"),
            needs=bnb,
        ),
        Scenario(
            f"HSDP 2 x {half}",
            ("--bf16", "True", "--use_parallelism_config", "--parallelism_config_dp_replicate_size", "2")
            + ("--parallelism_config_dp_shard_size", str(half)),
            min_gpus=4,
        ),
        Scenario(
            f"context parallelism 2 x {half}",
            ("--bf16", "True", "--use_parallelism_config", "--parallelism_config_cp_size", "2")
            + ("--parallelism_config_dp_shard_size", str(half), "--packing", "False"),
            min_gpus=2,
        ),
    ]


def _gpus() -> tuple[str, int, float | None]:
    import torch

    if not torch.cuda.is_available():
        return "cpu", 0, None
    name = torch.cuda.get_device_name(0)
    return name, torch.cuda.device_count(), next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def _missing(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def _common(cpu_smoke: bool, model: str, steps: int, world: int) -> list[str]:
    common = ["--model_name_or_path", model, "--num_processes", str(world), "--max_steps", str(steps)]
    common += ["--logging_steps", "1", "--save_strategy", "no", "--fsdp_activation_checkpointing", "true"]
    common += ["--gradient_checkpointing", "false", "--lora_r", "16", "--lora_dropout", "0.0", "--packing", "True"]
    if cpu_smoke:
        return [*common, "--use_cpu", "true", "--max_seq_len", "128", "--per_device_train_batch_size", "2"]
    return [*common, "--use_cpu", "false", "--max_seq_len", "2048", "--per_device_train_batch_size", "4"]


def _cli(args: list[str], env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsdp_tune", *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO
    )


def run_one(s: Scenario, args: list[str], out: Path, env: dict, peak: float | None, warmup: int, on_cpu: bool) -> dict:
    planned = _cli(["plan", *args, "--json", *(["--cpu"] if on_cpu else [])], env, 600)
    plan = json.loads(planned.stdout) if planned.returncode == 0 else {}
    started = time.time()
    proc = _cli(["train", *args, "--output_dir", str(out)], env, 1800)
    if proc.returncode:
        lines = [x for x in proc.stderr.splitlines() if "root cause" in x or x.startswith("error")]
        return {"error": " | ".join(lines[-3:]) or proc.stderr[-800:], "seconds": time.time() - started}
    summary = json.loads((out / "fsdp_tune_summary.json").read_text())
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [m for m in metrics if "loss" in m and "num_tokens" in m]
    first, last = timed[min(warmup, len(timed) - 2)], timed[-1]
    tokens_per_s = (last["num_tokens"] - first["num_tokens"]) / max(last["time"] - first["time"], 1e-9)
    world = summary["per_rank"] and len(summary["per_rank"]) or 1
    # model FLOPs per token: forward 2N, activation gradients 2N (LoRA trains ~no base weights), recompute 2N
    flops_per_token = 6 * plan.get("total_params", 0)
    rank = summary["per_rank"][0]
    loading = summary.get("extra", {}).get("loading", {})
    gpu_mib = [r["peak_gpu_allocated_before_first_step_mib"] for r in loading.get("per_rank", [])]
    return {
        "loading": loading.get("path"),
        "loading_peak_gpu_allocated_gib": max(gpu_mib) / 1024 if gpu_mib and None not in gpu_mib else None,
        "losses": summary["losses"],
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops_per_token / (peak * 1e12 * world) if peak and flops_per_token else None,
        "peak_allocated_gib": (rank.get("peak_gpu_allocated_mib") or 0) / 1024 or None,
        "peak_reserved_gib": (rank.get("peak_gpu_reserved_mib") or 0) / 1024 or None,
        "peak_rss_gib": rank["peak_rss_mib"] / 1024,
        "planned_gib": plan.get("per_rank_host_peak_gib" if on_cpu else "per_gpu_memory_gib"),
        "planned_allocated_gib": plan.get("peak_allocated_gib"),
        "adapter_ok": bool((summary.get("adapter_check") or {}).get("ok")),
        "mesh": summary.get("mesh"),
        "loss_first": summary["loss_first"],
        "loss_last": summary["loss_last"],
        "seconds": time.time() - started,
    }


def run(cpu_smoke: bool, steps: int, warmup: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    gpu_name, gpus, peak = ("cpu", 0, None) if cpu_smoke else _gpus()
    big = os.environ.get("GPU_CHECK_MODEL", "builtin:llama-8b")
    small = os.environ.get("GPU_CHECK_SMALL_MODEL", "builtin:llama-1b")
    results = {"gpu": gpu_name, "gpus": gpus, "peak_bf16_tflops": peak, "scenarios": {}}
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-gpu-check-"))
    for i, s in enumerate(scenarios(gpus)):
        if cpu_smoke and not s.cpu_smoke:
            continue
        missing = _missing(s.needs)
        if missing or (not cpu_smoke and gpus < s.min_gpus):
            why = f"needs {', '.join(missing)}" if missing else f"needs {s.min_gpus} GPUs, {gpus} here"
            results["scenarios"][s.name] = {"skipped": why}
            continue
        model = "builtin:tiny-llama" if cpu_smoke else (big if s.big else small)
        world = 2 if cpu_smoke else max(gpus, 1)
        args = ["--config", str(REPO / "configs" / "demo_cpu.yaml"), *_common(cpu_smoke, model, steps, world)]
        results["scenarios"][s.name] = run_one(s, [*args, *s.flags], work / f"s{i}", env, peak, warmup, cpu_smoke)
        if s.same_as:
            results["scenarios"][s.name]["same_as"] = s.same_as
    if not cpu_smoke:
        results["scenarios"]["CPU run on this GPU machine"] = run_one(
            Scenario("cpu", ()),
            ["--config", str(REPO / "configs" / "demo_cpu.yaml"), *_common(True, "builtin:tiny-llama", 4, 2)],
            work / "cpu",
            env,
            None,
            1,
            True,
        )
    return results


def report(results: dict) -> bool:
    print(f"GPU check on {results['gpu']} x {results['gpus']}")
    print(
        f"{'scenario':<40} {'tokens/s':>9} {'MFU':>5} {'alloc':>6} {'reserved':>8} {'planned':>7} {'adapter':>7}  loss"
    )
    ok = True
    for name, r in results["scenarios"].items():
        if "skipped" in r:
            print(f"{name:<40} skipped: {r['skipped']}")
            continue
        if "error" in r:
            ok = False
            print(f"{name:<40} FAILED: {r['error'][-600:]}")
            continue
        ok &= r["adapter_ok"]

        def f(v, fmt: str) -> str:
            return format(v, fmt) if isinstance(v, (int, float)) else "-"

        print(
            f"{name:<40} {r['tokens_per_s']:>9.0f} {f(r['mfu'], '.0%'):>5} {f(r['peak_allocated_gib'], '.1f'):>6} "
            f"{f(r['peak_reserved_gib'], '.1f'):>8} {f(r['planned_gib'], '.1f'):>7} "
            f"{'ok' if r['adapter_ok'] else 'BROKEN':>7}  {r['loss_first']:.3f}->{r['loss_last']:.3f}"
        )
        ok &= _loading_line(r, results["scenarios"])
    return ok


def _loading_line(r: dict, scenarios: dict) -> bool:
    """How the model loaded, its GPU peak before the first step, and (for a pair) whether both paths train alike:
    the same losses but for GPU nondeterminism (2% per step at most)."""
    gib = r.get("loading_peak_gpu_allocated_gib") or 0
    text = f"    loading: {r.get('loading')}, peak allocated before step 1: {gib:.1f} GiB"
    other = scenarios.get(r.get("same_as") or "", {})
    ok = True
    if other.get("losses"):
        diff = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(r["losses"], other["losses"], strict=False))
        ok = diff <= 0.02 and len(r["losses"]) == len(other["losses"])
        text += f"; losses vs {r['same_as']}: max relative difference {diff:.1e}{'' if ok else ' DIFFERENT'}"
    print(text)
    return ok


def main(argv: list[str]) -> int:
    cpu_smoke = "--cpu-smoke" in argv
    steps, warmup = (4, 1) if cpu_smoke else (int(os.environ.get("GPU_CHECK_STEPS", "8")), 3)
    if not cpu_smoke:
        from benchmarks import gpu_paths

        paths = gpu_paths.run()  # the decisions underneath, with torch/PEFT/accelerate alone
        print(paths["text"])
    results = run(cpu_smoke, steps, warmup)
    if not cpu_smoke:
        results["gpu_paths"] = paths
    ok = report(results) and (cpu_smoke or paths["ok"])
    out = REPO / "benchmarks" / "results" / ("gpu_check_cpu_smoke.json" if cpu_smoke else "gpu_check.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
