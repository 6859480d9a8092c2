"""validate-config and --help against `accelerate launch --help` and `python -c "import torch"`."""

from __future__ import annotations

import sys
from pathlib import Path

from benchmarks.timing import alternate, median

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(repeats: int = 7) -> dict:
    fsdp_tune = str(BIN / "fsdp-tune")
    commands = {
        "validate-config (seed LoRA YAML + flags)": [
            fsdp_tune,
            "validate-config",
            str(REPO / "configs/fsdp_config.yaml"),
            "--use_peft_lora",
            "True",
            "--lora_r",
            "8",
            "--bf16",
            "True",
        ],
        "validate-config (fsdp2.json)": [fsdp_tune, "validate-config", str(REPO / "configs/fsdp2.json")],
        "fsdp-tune --help": [fsdp_tune, "--help"],
        "accelerate launch --help": [str(BIN / "accelerate"), "launch", "--help"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
    }
    times = alternate(commands, repeats)
    med = {name: median(t) for name, t in times.items()}
    accel = med["accelerate launch --help"]
    worst = max(med["validate-config (seed LoRA YAML + flags)"], med["validate-config (fsdp2.json)"])
    return {
        "repeats": repeats,
        "median_s": med,
        "validate_config_worst_median_s": worst,
        "speedup_vs_accelerate_cli": accel / worst,
        "speedup_vs_import_torch": med['python -c "import torch"'] / worst,
        "targets": {
            "validate_config_under_0_25_s": worst < 0.25,
            "at_least_8x_faster_than_accelerate_cli": accel / worst >= 8,
        },
    }
