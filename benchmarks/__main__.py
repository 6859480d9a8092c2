"""`python -m benchmarks [cli|overhead|all]` (or `make bench`): prints a table, writes results/latest.json."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "latest.json"


def _machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main(argv: list[str]) -> None:
    which = argv[0] if argv else "all"
    results: dict = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results["machine"] = _machine()
    if which in ("cli", "all"):
        from benchmarks import cli_latency

        r = results["cli_latency"] = cli_latency.run()
        print("CLI latency (median of 7 alternating runs)")
        for name, t in r["median_s"].items():
            print(f"  {name:<45} {t * 1000:8.0f} ms")
        print(
            f"  validate-config vs accelerate launch --help: {r['speedup_vs_accelerate_cli']:.1f}x faster; "
            f"targets: {r['targets']}"
        )
    if which in ("overhead", "all"):
        from benchmarks import launcher_overhead

        r = results["launcher_overhead"] = launcher_overhead.run()
        print("Launcher overhead: CPU demo via fsdp-tune vs plain torchrun + SFTTrainer (medians of 3)")
        for side, m in r["median"].items():
            print(f"  {side:<10} " + "  ".join(f"{k}={v:.3f}" for k, v in m.items()))
        print(
            "  ratios fsdp-tune/plain: "
            + ", ".join(f"{k} {v:.3f}" for k, v in r["ratios_fsdp_tune_over_plain"].items())
        )
        print(f"  overhead on wall time: {r['overhead_wall_pct']:+.1f}%; final loss agrees: {r['final_loss_agrees']}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main(sys.argv[1:])
