"""The CPU demo through `fsdp-tune train` against the plain torchrun + SFTTrainer script, alternately."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import plain_sft
from benchmarks.timing import offline_env

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"{cmd[:4]} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def run(repeats: int = 3) -> dict:
    from fsdp_tune.sources.builtin import materialize

    model_dir = str(materialize("tiny-llama"))
    env = offline_env()
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-bench-"))
    rows: dict[str, list[dict]] = {"fsdp-tune": [], "plain": []}
    try:
        for i in range(repeats):
            out = work / f"ft{i}"
            wall = _timed(
                [
                    str(BIN / "fsdp-tune"),
                    "train",
                    "--config",
                    str(REPO / "configs/demo_cpu.yaml"),
                    "--output_dir",
                    str(out),
                    "--max_steps",  # plain_sft.py's steps (the demo itself trains longer, to chat after)
                    "60",
                ],
                env,
            )
            s = json.loads((out / "fsdp_tune_summary.json").read_text())
            rows["fsdp-tune"].append(
                {
                    "wall_s": wall,
                    "train_runtime_s": s["train_runtime_s"],
                    "time_to_first_step_s": s["time_to_first_step_s"],
                    "peak_rss_mib_rank0": s["per_rank"][0]["peak_rss_mib"],
                    "loss_last": s["loss_last"],
                }
            )
            out = work / f"plain{i}"
            out.mkdir()
            wall = _timed(
                plain_sft.command(model_dir, str(out)),
                env,
            )
            p = json.loads((out / "plain_summary.json").read_text())
            rows["plain"].append(
                {
                    "wall_s": wall,
                    "train_runtime_s": p["train_runtime_s"],
                    "time_to_first_step_s": p["time_to_first_step_s"],
                    "peak_rss_mib_rank0": p["peak_rss_mib_rank0"],
                    "loss_last": p["losses"][-1],
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in rows.items()}
    ft, plain = med["fsdp-tune"], med["plain"]
    return {
        "repeats": repeats,
        "median": med,
        "ratios_fsdp_tune_over_plain": {
            k: ft[k] / plain[k] for k in ("wall_s", "train_runtime_s", "time_to_first_step_s", "peak_rss_mib_rank0")
        },
        "overhead_wall_pct": 100 * (ft["wall_s"] / plain["wall_s"] - 1),
        "final_loss_agrees": abs(ft["loss_last"] - plain["loss_last"]) < 1e-3,
        "targets": {"launcher_overhead_under_5_pct": ft["wall_s"] / plain["wall_s"] < 1.05},
    }
