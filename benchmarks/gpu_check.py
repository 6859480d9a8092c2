"""One-shot GPU check: LoRA and QLoRA, FSDP2 on one GPU, bf16, seq 2048, a 8B-class Llama with random weights.

Prints tokens/s, model-FLOPs utilisation against the GPU's bf16 peak, and peak allocated/reserved memory
next to `fsdp-tune plan`'s prediction. `--cpu-smoke` runs the same path end to end on CPU with the tiny
model (what CI can check). Results: benchmarks/results/gpu_check.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "4090": 165.0, "L40S": 362.0}

SCENARIOS = {
    "LoRA": [],
    "QLoRA": [
        "--use_4bit_quantization",
        "True",
        "--use_nested_quant",
        "True",
        "--bnb_4bit_compute_dtype",
        "bfloat16",
        "--bnb_4bit_quant_storage_dtype",
        "bfloat16",
    ],
}


def _gpu_peak() -> tuple[str, float | None]:
    try:
        out = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.TimeoutExpired):
        return "cpu", None
    name = out[0] if out else "cpu"
    return name, next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def run(cpu_smoke: bool, model: str, steps: int, warmup: int) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    gpu_name, peak = ("cpu", None) if cpu_smoke else _gpu_peak()
    common = [
        "--model_name_or_path",
        model,
        "--num_processes",
        "1",
        "--max_steps",
        str(steps),
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--fsdp_version",
        "2",
        "--fsdp_activation_checkpointing",
        "true",
        "--gradient_checkpointing",
        "false",
        "--lora_r",
        "16",
        "--lora_dropout",
        "0.0",
        "--packing",
        "True",
    ]
    if cpu_smoke:
        common += [
            "--use_cpu",
            "true",
            "--max_seq_len",
            "128",
            "--per_device_train_batch_size",
            "2",
            "--mixed_precision",
            "no",
        ]
    else:
        common += [
            "--max_seq_len",
            "2048",
            "--per_device_train_batch_size",
            "4",
            "--bf16",
            "True",
            "--use_cpu",
            "false",
        ]
    results = {"gpu": gpu_name, "peak_bf16_tflops": peak, "model": model, "scenarios": {}}
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-gpu-check-"))
    for name, extra in SCENARIOS.items():
        out = work / name
        args = ["--config", str(REPO / "configs" / "demo_cpu.yaml"), *common, *extra, "--output_dir", str(out)]
        plan = json.loads(
            subprocess.run(
                [sys.executable, "-m", "fsdp_tune", "plan", *args[:-2], "--json", *(["--cpu"] if cpu_smoke else [])],
                capture_output=True,
                text=True,
                env=env,
                check=True,
                timeout=600,
            ).stdout
        )
        proc = subprocess.run(
            [sys.executable, "-m", "fsdp_tune", "train", *args], capture_output=True, text=True, env=env, timeout=1800
        )
        if proc.returncode:
            results["scenarios"][name] = {"error": proc.stderr[-2000:]}
            continue
        summary = json.loads((out / "fsdp_tune_summary.json").read_text())
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        timed = [m for m in metrics if "loss" in m and "num_tokens" in m]
        first, last = timed[min(warmup, len(timed) - 2)], timed[-1]
        tokens_per_s = (last["num_tokens"] - first["num_tokens"]) / max(last["time"] - first["time"], 1e-9)
        n = plan["total_params"]
        # model FLOPs per token: forward 2N, activation gradients 2N (LoRA trains ~no base weights), recompute 2N
        flops_per_token = 6 * n
        rank = summary["per_rank"][0]
        results["scenarios"][name] = {
            "tokens_per_s": tokens_per_s,
            "mfu": tokens_per_s * flops_per_token / (peak * 1e12) if peak else None,
            "peak_allocated_gib": rank.get("peak_gpu_allocated_mib", 0) / 1024 or None,
            "peak_reserved_gib": rank.get("peak_gpu_reserved_mib", 0) / 1024 or None,
            "peak_rss_gib": rank["peak_rss_mib"] / 1024,
            "planned_gib": plan["per_gpu_memory_gib"] if not cpu_smoke else plan["per_rank_host_peak_gib"],
            "planned_allocated_gib": plan.get("peak_allocated_gib"),  # compare with peak_allocated_gib
            "loss_first": summary["loss_first"],
            "loss_last": summary["loss_last"],
        }
    return results


def main(argv: list[str]) -> int:
    cpu_smoke = "--cpu-smoke" in argv
    model = "builtin:tiny-llama" if cpu_smoke else os.environ.get("GPU_CHECK_MODEL", "builtin:llama-8b")
    steps, warmup = (4, 1) if cpu_smoke else (int(os.environ.get("GPU_CHECK_STEPS", "12")), 3)
    results = run(cpu_smoke, model, steps, warmup)
    print(
        f"GPU check on {results['gpu']} with {model} (FSDP2, 1 rank, {'CPU smoke' if cpu_smoke else 'bf16, seq 2048'})"
    )
    print(
        f"{'scenario':<8} {'tokens/s':>10} {'MFU':>6} {'alloc GiB':>10} {'reserved GiB':>13} {'planned GiB':>12} "
        f"{'RSS GiB':>8} {'loss':>16}"
    )
    ok = True
    for name, r in results["scenarios"].items():
        if "error" in r:
            ok = False
            print(f"{name:<8} FAILED: {r['error'][-600:]}")
            continue
        mfu = f"{r['mfu']:.0%}" if r["mfu"] is not None else "n/a"
        alloc = f"{r['peak_allocated_gib']:.1f}" if r["peak_allocated_gib"] else "-"
        reserved = f"{r['peak_reserved_gib']:.1f}" if r["peak_reserved_gib"] else "-"
        print(
            f"{name:<8} {r['tokens_per_s']:>10.0f} {mfu:>6} {alloc:>10} {reserved:>13} {r['planned_gib']:>12.2f} "
            f"{r['peak_rss_gib']:>8.2f} {r['loss_first']:>7.3f}->{r['loss_last']:<7.3f}"
        )
    out = REPO / "benchmarks" / "results" / ("gpu_check_cpu_smoke.json" if cpu_smoke else "gpu_check.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
