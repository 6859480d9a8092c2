"""Memory of sharding on CPU: a ~125M-parameter Llama on 2 ranks. Peak RSS per rank for FSDP2 (fsdp-tune)
against plain DDP, with cpu_ram_efficient_loading on and off, for LoRA and for full fine-tuning (where the
optimizer state, which FSDP shards, outweighs the loading copies), each next to `fsdp-tune plan`'s prediction."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import plain_sft
from benchmarks.timing import offline_env

REPO = Path(__file__).resolve().parents[1]
STEPS, BATCH, SEQ = 4, 4, 128


def run() -> dict:
    from fsdp_tune.sources.builtin import materialize

    model_dir = str(materialize("small-llama"))
    env = offline_env()
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-mem-"))
    common = [
        "--config",
        str(REPO / "configs/demo_cpu.yaml"),
        "--model_name_or_path",
        "builtin:small-llama",
        "--logging_steps",
        "1",
        "--max_steps",
        str(STEPS),
        "--per_device_train_batch_size",
        str(BATCH),
        "--max_seq_len",
        str(SEQ),
        "--save_strategy",
        "no",
    ]
    out: dict = {"model": "builtin:small-llama", "ranks": 2}
    try:
        for label, extra in (
            ("fsdp2", []),
            ("fsdp2 + cpu_ram_efficient_loading", ["--fsdp_cpu_ram_efficient_loading", "true"]),
            ("full fine-tuning: fsdp2", ["--use_peft_lora", "false"]),
        ):
            d = work / label.replace(" ", "_").replace("+", "")
            plan = json.loads(
                subprocess.run(
                    [sys.executable, "-m", "fsdp_tune", "plan", *common, *extra, "--json"],
                    capture_output=True,
                    text=True,
                    env=env,
                    check=True,
                ).stdout
            )
            subprocess.run(
                [sys.executable, "-m", "fsdp_tune", "train", *common, *extra, "--output_dir", str(d)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
                timeout=900,
            )
            s = json.loads((d / "fsdp_tune_summary.json").read_text())
            out[label] = {
                "peak_rss_mib": [r["peak_rss_mib"] for r in s["per_rank"]],
                "predicted_mib": plan["per_rank_host_peak_gib"] * 1024,
                "loss_last": s["loss_last"],
            }
        for label, full in (("ddp (plain script)", "0"), ("full fine-tuning: ddp (plain script)", "1")):
            d = work / label.replace(" ", "_").replace(":", "").replace("(", "").replace(")", "")
            d.mkdir()
            subprocess.run(
                plain_sft.command(model_dir, str(d)),
                capture_output=True,
                text=True,
                env=dict(
                    env,
                    PLAIN_MODE="ddp",
                    PLAIN_FULL=full,
                    PLAIN_STEPS=str(STEPS),
                    PLAIN_BATCH=str(BATCH),
                    PLAIN_SEQ=str(SEQ),
                ),
                check=True,
                timeout=900,
            )
            p = json.loads((d / "plain_summary.json").read_text())
            out[label] = {
                "peak_rss_mib": [p["peak_rss_mib_rank0"]],
                "predicted_mib": None,
                "loss_last": p["losses"][-1] if p["losses"] else None,
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fsdp_rank0 = out["fsdp2"]["peak_rss_mib"][0]
    out["fsdp2_over_ddp_rank0"] = fsdp_rank0 / out["ddp (plain script)"]["peak_rss_mib"][0]
    out["full_ft_fsdp2_over_ddp_rank0"] = (
        out["full fine-tuning: fsdp2"]["peak_rss_mib"][0]
        / out["full fine-tuning: ddp (plain script)"]["peak_rss_mib"][0]
    )
    out["plan_error"] = {
        k: max(abs(m / v["predicted_mib"] - 1) for m in v["peak_rss_mib"])
        for k, v in out.items()
        if isinstance(v, dict) and v.get("predicted_mib")
    }
    return out
