"""glibc's mmap threshold on CPU runs: sharded loading of the 443M Llama (benchmarks/loading.py's runs), LoRA and
QLoRA, with glibc's default (a dynamic threshold that rises to the largest buffer freed, up to 32 MiB) and with
MALLOC_MMAP_THRESHOLD_ fixed at 64 KiB, 1 MiB and 4 MiB; two rounds, the settings alternating. Whole-run peak RSS
per rank above the baseline (x the checkpoint) and train runtime, per setting: the medians of the rounds."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from benchmarks import loading

SETTINGS = {"default": {}, "64K": {"MALLOC_MMAP_THRESHOLD_": "65536"}}
SETTINGS |= {"1M": {"MALLOC_MMAP_THRESHOLD_": "1048576"}, "4M": {"MALLOC_MMAP_THRESHOLD_": "4194304"}}
ROUNDS = 2


def run() -> dict:
    from fsdp_tune.sources.builtin import materialize

    folder = materialize(loading.MODEL)
    ckpt_mib = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 2**20
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-malloc-"))
    rows = []
    for round_ in range(ROUNDS):
        for mode, flags in loading.MODES.items():
            for name, env in SETTINGS.items():
                r = loading._one(work / f"{mode}_{name}_{round_}", mode, "sharded", name, flags, env, ckpt_mib)
                rows.append({**r, "round": round_})
                print(_line(rows[-1]), flush=True)
    return summarize(rows)


def summarize(rows: list[dict]) -> dict:
    table = {}
    for mode in loading.MODES:
        for name in SETTINGS:
            mine = [r for r in rows if r["mode"] == mode and r["malloc"] == name]
            if not mine:
                continue
            table[f"{mode} {name}"] = {
                "run_x_ckpt": statistics.median(k["run_x_ckpt"] for r in mine for k in r["ranks"]),
                "train_runtime_s": statistics.median(r["train_runtime_s"] for r in mine),
                "time_to_first_step_s": statistics.median(r["time_to_first_step_s"] for r in mine),
                "losses_equal": len({tuple(r["losses"]) for r in mine}) == 1,
                "rounds": len(mine),
            }
    return {"model": f"builtin:{loading.MODEL}", "path": "sharded", "table": table, "rows": rows}


def _line(r: dict) -> str:
    k = r["ranks"]
    return (
        f"  {r['round']} {r['mode']:<6}{r['malloc']:<8} whole run {k[0]['run_x_ckpt']:.2f}x / {k[1]['run_x_ckpt']:.2f}x"
        f"  train {r['train_runtime_s']:.1f} s  first step at {r['time_to_first_step_s']:.1f} s"
    )
