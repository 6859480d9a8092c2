"""Sharded loading against today's transformers/accelerate path, side by side in one run: a 443M-parameter Llama
(builtin:llama-443m, 1.7 GiB of fp32 safetensors) on 2 CPU ranks, LoRA and 4-bit QLoRA, through `fsdp-tune train`
(--loading transformers | sharded), each also with glibc's MALLOC_MMAP_THRESHOLD_=65536.

Per rank, from the run summary (worker/loading/report.py): RSS before the model (the runtime, tokenizer and data: the
baseline), the peak when the first step begins (loading, sharding and the Trainer's preparation done: the loading
phase), the whole run's peak, and the seconds from the model's build to the first step's start. Peaks are given
above the baseline and as a multiple of the checkpoint's size; the targets are <= 0.75x (LoRA) and <= 0.35x (QLoRA).
Both paths must train alike: losses and adapter files are compared.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.timing import offline_env

REPO = Path(__file__).resolve().parents[1]
MODEL = "llama-443m"
TARGETS = {"lora": 0.75, "qlora": 0.35}
QLORA = ["--use_4bit_quantization", "True", "--bnb_4bit_quant_storage_dtype", "float32"]
QLORA += ["--bnb_4bit_compute_dtype", "float32", "--use_nested_quant", "True"]
MODES = {"lora": ("--max_steps", "2"), "qlora": (*QLORA, "--max_steps", "1")}  # a CPU 4-bit step takes a minute
MALLOC = {"default": {}, "mmap_threshold": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
COMMON = [
    *("--config", str(REPO / "configs/demo_cpu.yaml"), "--model_name_or_path", f"builtin:{MODEL}"),
    *("--per_device_train_batch_size", "1", "--max_seq_len", "64", "--logging_steps", "1"),
    *("--save_strategy", "no", "--warmup_steps", "0", "--lora_r", "16"),
]


def run(only: str | None = None) -> dict:
    from fsdp_tune.sources.builtin import materialize

    folder = materialize(MODEL)
    ckpt_mib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-loading-"))
    rows = []
    try:
        for mode, flags in MODES.items():
            for malloc, extra_env in MALLOC.items():
                for path in ("transformers", "sharded"):
                    label = f"{mode} {path} {malloc}"
                    if only and only not in label:
                        continue
                    rows.append(_one(work / label.replace(" ", "_"), mode, path, malloc, flags, extra_env, ckpt_mib))
                    print(_line(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "model": f"builtin:{MODEL}",
        "checkpoint_mib": round(ckpt_mib, 1),
        "ranks": 2,
        "targets": TARGETS,
        "rows": rows,
        "same_training": _same_training(rows),
    }


def _one(out: Path, mode: str, path: str, malloc: str, flags, extra_env: dict, ckpt_mib: float) -> dict:
    cmd = [sys.executable, "-m", "fsdp_tune", "train", *COMMON, *flags, "--loading", path, "--output_dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=offline_env(**extra_env), timeout=3600, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    s = json.loads((out / "fsdp_tune_summary.json").read_text())
    loading = s["extra"]["loading"]
    ranks = []
    for memory, load in zip(s["per_rank"], loading["per_rank"], strict=True):
        base = load["rss_before_model_mib"]
        ranks.append(
            {
                "baseline_mib": base,
                "loading_peak_mib": load["peak_rss_before_first_step_mib"],
                "run_peak_mib": memory["peak_rss_mib"],
                "loading_x_ckpt": round((load["peak_rss_before_first_step_mib"] - base) / ckpt_mib, 3),
                "run_x_ckpt": round((memory["peak_rss_mib"] - base) / ckpt_mib, 3),
                "model_ready_s": load["model_ready_s"],
                "to_first_step_s": load["model_start_to_first_step_s"],
            }
        )
    adapter = hashlib.sha256((out / "adapter_model.safetensors").read_bytes()).hexdigest()[:16]
    return {
        "mode": mode,
        "path": loading["path"],
        "malloc": malloc,
        "ranks": ranks,
        "losses": s["losses"],
        "time_to_first_step_s": s["time_to_first_step_s"],
        "train_runtime_s": round(s["train_runtime_s"], 1),
        "adapter_sha256": adapter,
        "seconds": loading["seconds"],
    }


def _same_training(rows: list[dict]) -> dict:
    """Per mode and malloc setting: do both paths give the same losses and adapter bytes?"""
    out = {}
    for r in rows:
        if r["path"] != "sharded":
            continue
        other = [o for o in rows if o["mode"] == r["mode"] and o["malloc"] == r["malloc"] and o["path"] != "sharded"]
        if other:
            same = other[0]["losses"] == r["losses"] and other[0]["adapter_sha256"] == r["adapter_sha256"]
            out[f"{r['mode']} {r['malloc']}"] = same
    return out


def _line(r: dict) -> str:
    ranks = "  ".join(
        f"r{i}: base {k['baseline_mib']:.0f}, loading {k['loading_peak_mib']:.0f} ({k['loading_x_ckpt']:.2f}x), "
        f"run {k['run_peak_mib']:.0f} ({k['run_x_ckpt']:.2f}x), to step 1 {k['to_first_step_s']:.1f}s"
        for i, k in enumerate(r["ranks"])
    )
    return f"  {r['mode']:<6}{r['path']:<13}{r['malloc']:<15}{ranks}"


def as_markdown(result: dict) -> str:
    """The BENCHMARKS.md table: MiB above the baseline (x the checkpoint), rank 0 / rank 1."""
    lines = [
        "| mode | path | malloc | loading peak, MiB above baseline (x ckpt) | whole-run peak (x ckpt) "
        "| model build -> step 1 start, s | losses | same adapter |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        load = " / ".join(_above(k, "loading_peak_mib", "loading_x_ckpt") for k in r["ranks"])
        whole = " / ".join(_above(k, "run_peak_mib", "run_x_ckpt") for k in r["ranks"])
        step = " / ".join(f"{k['to_first_step_s']:.1f}" for k in r["ranks"])
        same = result["same_training"].get(f"{r['mode']} {r['malloc']}", "")
        losses = ", ".join(f"{x:.4f}" for x in r["losses"])
        lines.append(f"| {r['mode']} | {r['path']} | {r['malloc']} | {load} | {whole} | {step} | {losses} | {same} |")
    return "\n".join(lines)


def _above(rank: dict, peak: str, ratio: str) -> str:
    return f"{rank[peak] - rank['baseline_mib']:.0f} ({rank[ratio]:.2f}x)"
