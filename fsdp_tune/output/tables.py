"""Tables: runs side by side (`report`) and the environment (`env`)."""

from __future__ import annotations

from fsdp_tune.config.methods import SFT, row_of


def format_rows(rows: list[dict]) -> str:
    """`fsdp-tune report`: runs side by side (peak memory is GPU reserved on GPU runs, RSS on CPU runs)."""

    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) else "-"

    width = max(12, *(len(r["run"][-40:]) for r in rows))
    lines = [
        f"{'run':<{width}} {'status':<11} {'steps':>6} {'loss':>8} {'eval loss':>9} {'tok/s':>8} "
        f"{'1st step s':>10} {'time s':>8} {'peak MiB':>9}"
    ]
    for r in rows:
        lines.append(
            f"{r['run'][-40:]:<{width}} {r['status']:<11} {r['steps']:>6} {f(r['loss_last'], '.4f'):>8} "
            f"{f(r['eval_loss_last'], '.4f'):>9} {f(r['tokens_per_s'], '.0f'):>8} "
            f"{f(r['time_to_first_step_s'], '.1f'):>10} {f(r['train_runtime_s'], '.1f'):>8} "
            f"{f(r['peak_memory_mib'], '.0f'):>9}" + _method(r)
        )
    lines += [f"{r['run']}: {r['status']}: {r['cause']}" for r in rows if r.get("cause")]
    return "\n".join(lines)


def _method(row: dict) -> str:
    """A preference run's method and its own last metrics (`  dpo: rewards/accuracies 1.000, ...`); nothing for
    SFT."""
    if not row_of(row.get("method") or SFT).named:
        return ""
    shown = [
        f"{m['key']} {m['last']:.3f}" for m in (row.get("metric_1"), row.get("metric_2")) if m and m["last"] is not None
    ]
    return f"  {row['method']}: " + ", ".join(shown)


def _in_range(tested: dict | None) -> str:
    if tested is None:
        return ""
    return f"  (tested {tested['range']}: {'in range' if tested['in_range'] else 'OUTSIDE the tested range'})"


def format_info(info: dict) -> str:
    tested = info.get("tested") or {}
    lines = [f"{k:<22} {v}{_in_range(tested.get(k))}" for k, v in info["versions"].items()]
    for key in (
        "platform",
        "cpu_count",
        "ram_gib",
        "cuda_available",
        "cuda_version",
        "nccl_available",
        "gloo_available",
        "bitsandbytes_backend",
        "flash_attn_installed",
    ):
        lines.append(f"{key:<22} {info.get(key)}")
    for i, gpu in enumerate(info.get("gpus") or []):
        lines.append(f"gpu {i:<18} {gpu['name']}, {gpu['memory_gib']} GiB, bf16={gpu['bf16']}")
    return "\n".join(lines)
