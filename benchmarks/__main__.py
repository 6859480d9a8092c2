"""`python -m benchmarks [cli|overhead|memory|plan|all|sweep|loading|malloc|trace|grpo_generation]` (or `make bench`):
prints a table and writes results/latest.json."""

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
    if which == "sweep":  # not part of "all": a few minutes per row on 2 cores
        from benchmarks import sweep

        outcomes = sweep.run(ci="--ci" in argv, only=next((a for a in argv[1:] if not a.startswith("--")), None))
        results["sweep"] = [vars(o) for o in outcomes]
        print(sweep.as_markdown(outcomes))
    if which == "loading":  # not part of "all": a 443M model, eight runs, about half an hour on 2 cores
        from benchmarks import loading

        r = results["loading"] = loading.run(only=next((a for a in argv[1:] if not a.startswith("--")), None))
        print(f"Sharded loading vs from_pretrained: {r['model']} ({r['checkpoint_mib']:.0f} MiB), 2 CPU ranks")
        print(loading.as_markdown(r))
        print(f"  same losses and adapter on both paths: {r['same_training']}")
    if which == "trace":  # not part of "all": the plan against the trace, 84 cases, about 40 minutes on 2 cores
        from benchmarks import trace_grid

        rows = trace_grid.run(ci="--ci" in argv, only=next((a for a in argv[1:] if not a.startswith("--")), None))
        results["trace_grid"] = rows
        print(trace_grid.as_markdown(rows))
        within = sum(r["within"] for r in rows)
        print(f"  plan within {trace_grid.TOLERANCE:.0%} of the trace: {within} of {len(rows)}")
    if which == "malloc":  # not part of "all": sixteen runs of the 443M model, about 10 minutes on 2 cores
        from benchmarks import malloc

        r = results["malloc"] = malloc.run()
        for name, v in r["table"].items():
            print(f"  {name:<16} whole run {v['run_x_ckpt']:.2f}x ckpt, train {v['train_runtime_s']:.1f} s")
    if which == "grpo_generation":  # not part of "all": three GRPO runs in one 2-rank launch, a minute or two
        from benchmarks import grpo_generation

        r = results["grpo_generation"] = grpo_generation.run()
        print(f"GRPO generation on 2 CPU ranks, one launch ({r['settings']}; {r['machine_note']})")
        print(grpo_generation.as_markdown(r))
        print(f"  gathered within 1.3x of DDP's generation time: {r['gathered_within_1_3x_of_ddp']}")
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
    if which in ("memory", "all"):
        from benchmarks import memory

        r = results["memory"] = memory.run()
        print("Memory of sharding on CPU: ~125M-parameter Llama, 2 ranks (peak RSS per rank, MiB)")
        for label, v in r.items():
            if isinstance(v, dict) and "peak_rss_mib" in v:
                pred = f"{v['predicted_mib']:.0f}" if v["predicted_mib"] else "-"
                print(
                    f"  {label:<36} measured {', '.join(f'{m:.0f}' for m in v['peak_rss_mib']):<12} "
                    f"planned {pred:>6}   final loss {v['loss_last']}"
                )
        print(
            f"  FSDP2 / DDP peak RSS (rank 0): LoRA {r['fsdp2_over_ddp_rank0']:.2f}, full fine-tuning "
            f"{r['full_ft_fsdp2_over_ddp_rank0']:.2f}; plan error: "
            + ", ".join(f"{k} {e:.0%}" for k, e in r["plan_error"].items())
        )
    if which in ("plan", "all"):
        from benchmarks import plan_accuracy

        r = results["plan_accuracy"] = plan_accuracy.run()
        print("fsdp-tune plan against every public measurement found (GiB; each planned as it was made; no training)")
        print(f"  {'measurement':<42} {'measured':<15} {'published':>9} {'planned':>8} {'error':>6}  fits")
        for row in r["rows"]:
            if row["skip"]:
                print(f"  {row['id']:<42} not planned: {row['skip']}")
                continue
            cap = " (at capacity)" if row["at_capacity"] else ""
            verdict = ("fits" if row["fits"] else "does not fit") + ("" if row["verdict_ok"] else " WRONG")
            print(
                f"  {row['id']:<42} {row['measured']:<15} {row['published']:9.2f} {row['planned']:8.2f} "
                f"{row['error']:+6.0%}  {verdict}{cap}"
                + (f" (point {row['point']:.2f}, {row['point_error']:+.0%})" if row["measured"] == "unknown" else "")
            )
        print(
            f"  within {r['tolerance']:.0%}: {r['within_tolerance']} of {r['not_at_capacity']} not at capacity; "
            f"median |error| {r['median_abs_error']:.1%}; "
            f"fits verdicts right: {r['fits_verdicts_right']} of {r['planned']}"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main(sys.argv[1:])
