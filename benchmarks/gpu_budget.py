"""The GPU check's time budget: each scenario's estimate on the lent machine, derived from a --cpu-smoke rehearsal
(benchmarks/data/gpu_check_rehearsal.json) by a stated scaling, and the plan printed before anything runs.

A rehearsal scenario's seconds split into its steps (metrics.jsonl) and the host work around them (imports,
data, the trainer, saving, the adapter check). On the lent machine: the host work scaled by the speed of its host
against the rehearsal's, plus per launch the CUDA start and the model's read, plus the steps at ASSUMED_MFU of the
GPU's peak (4N a token, 6N with recompute; times OFFLOAD_FACTOR / QLORA_FACTOR). The speed is the probe's imports
(every fsdp_tune module, the libraries with them) there against the rehearsal's: LENT_IMPORTS_S assumed for the
plan printed first, measured once the probe ran, then refined by each scenario's host work against its rehearsal's
(a loaded rehearsal machine is slow at both, so the ratio carries). Every constant below is an assumption,
printed with the plan; `python -m benchmarks.gpu_verdict OUT` puts each estimate beside what the scenario took.

  python -m benchmarks.gpu_budget plan               the plan for one H200 from the recorded rehearsal
  python -m benchmarks.gpu_budget record OUT         OUT (a --cpu-smoke run's folder) becomes the recorded rehearsal
No torch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.gpu_scenarios import Mode, Scenario, args_for, scenarios

REPO = Path(__file__).resolve().parents[1]
REHEARSAL = REPO / "benchmarks" / "data" / "gpu_check_rehearsal.json"
BUDGET_S = {"cuda": 450.0, "cpu": 3600.0}  # the whole command, wheels included; GPU_CHECK_BUDGET_S overrides
LENT_IMPORTS_S = 15.0  # the probe's imports on the lent machine (16 cores, not shared), until it measures them
HOST_SPEED = 0.5  # host work there against the rehearsal's, when the rehearsal recorded no imports
CUDA_START_S = 5.0  # a rank's CUDA context, NCCL communicator and first allocations, per launch
READ_GIB_S = 4.0  # a launch reading its model's safetensors: written minutes before, in the page cache (128 GiB)
WRITE_GIB_S = 1.0  # a builtin model written once (initialised on the GPU: seconds)
ASSUMED_MFU = 0.30  # at 4N, for an estimate's step time (the throughput run measures it)
OFFLOAD_FACTOR = 3.0  # step time under cpu_offload: every step's parameters and gradients cross PCIe
QLORA_FACTOR = 1.5  # step time of 4-bit weights, dequantized in the forward and the backward
CUDA_PROBE_S = 20.0  # the probe's CUDA stages: context, matmul, pinned copies, NCCL, bitsandbytes
DEFAULT_HOST_S = 30.0  # a scenario the rehearsal holds no time for (rehearsal seconds, before the speed)
CAP_FACTOR, CAP_MIN_S = 3.0, 60.0  # a scenario is cut at max(CAP_MIN_S, CAP_FACTOR x its estimate) on a GPU
PEAK_TFLOPS = 989.0
ASSUMPTIONS = (
    f"host work at the speed of the probe's imports ({LENT_IMPORTS_S:.0f} s assumed there) against the rehearsal's; "
    f"{CUDA_START_S:.0f} s CUDA start and the model read at "
    f"{READ_GIB_S:.0f} GiB/s per launch; steps at {ASSUMED_MFU:.0%} MFU of {PEAK_TFLOPS:.0f} TFLOP/s "
    f"(x{OFFLOAD_FACTOR} offload, x{QLORA_FACTOR} 4-bit); models written at {WRITE_GIB_S:.0f} GiB/s in the background"
)


def llama_params(model: str) -> int:
    """A builtin model's parameter count from its preset (Llama: untied embeddings, GQA), without torch."""
    from fsdp_tune.sources.builtin import PRESETS

    name = model.removeprefix("builtin:")
    p = PRESETS[name if name in PRESETS else "tiny-llama"]  # the vision scenario's tiny VLM: a folder, tiny-sized
    h, i, layers, v = p["hidden_size"], p["intermediate_size"], p["num_hidden_layers"], p["vocab_size"]
    kv = h // p["num_attention_heads"] * p["num_key_value_heads"]
    return layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h) + 2 * v * h + h


def load_rehearsal(path: Path = REHEARSAL) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"scenarios": {}}


def _flag(args: list[str], key: str) -> str | None:
    return args[args.index(key) + 1] if key in args else None


def estimate(s: Scenario, mode: Mode, rehearsal: dict, speed: float = HOST_SPEED) -> dict:
    """{"seconds", "parts"} for scenario s on `mode`'s machine (on CPU: the rehearsal's own seconds); `speed`: the
    host work's scale (HOST_SPEED, or what the machine showed: measured_speed)."""
    seen = rehearsal.get("scenarios", {})
    base = seen.get(s.name) or seen.get(s.like or "") or {}
    if mode.device == "cpu":
        return {"seconds": float(base.get("seconds") or DEFAULT_HOST_S), "parts": {"rehearsal": True}}
    host_s = base.get("host_s", DEFAULT_HOST_S) if base else DEFAULT_HOST_S
    if s.cpu_run:  # the whole run is host work
        host_s = base.get("seconds", DEFAULT_HOST_S) if base else DEFAULT_HOST_S
    parts = {"host": speed * host_s}
    if s.kind in ("train", "resume", "throughput") and not s.cpu_run:
        args = args_for(s, mode)
        n = llama_params(mode.model(s))
        steps, _ = mode.steps_of(s)
        steps = steps + max(steps // 2, 2) if s.kind == "resume" else steps  # the resumed half again
        tokens = int(_flag(args, "--max_seq_len")) * int(_flag(args, "--per_device_train_batch_size"))
        recompute = (_flag(args, "--fsdp_activation_checkpointing") or "true") == "true"
        step_s = tokens * (6 if recompute else 4) * n / (ASSUMED_MFU * PEAK_TFLOPS * 1e12)
        step_s *= OFFLOAD_FACTOR if s.asks_offload else 1.0
        step_s *= QLORA_FACTOR if "--use_4bit_quantization" in args else 1.0
        parts.update(
            cuda_start=s.launches * CUDA_START_S,
            model_read=s.launches * n * 2 / 2**30 / READ_GIB_S,
            steps=steps * step_s,
        )
    elif s.kind == "paths":
        parts["cuda_start"] = CUDA_START_S
    return {"seconds": round(sum(parts.values()), 1), "parts": {k: round(v, 1) for k, v in parts.items()}}


def build_seconds(model: str, rehearsal: dict, speed: float = HOST_SPEED) -> float:
    """A builtin model built on the lent machine: the rehearsal's tiny build (the tokenizer, the imports), then the
    weights written."""
    tiny = rehearsal.get("tiny_build_s") or 10.0
    return round(speed * tiny + 2.0 + llama_params(model) * 2 / 2**30 / WRITE_GIB_S, 1)


def measured_speed(rehearsal: dict, imports_s: float | None = None, ratios: tuple[float, ...] = ()) -> float:
    """The host work's scale on the lent machine: its probe's imports against the rehearsal's (LENT_IMPORTS_S until
    measured), and each scenario's host work against its rehearsal's once they ran (the mean of all)."""
    seen = list(ratios)
    if rehearsal.get("probe_imports_s"):
        seen.append((imports_s or LENT_IMPORTS_S) / rehearsal["probe_imports_s"])
    return round(min(max(sum(seen) / len(seen), 0.05), 3.0), 3) if seen else HOST_SPEED


def host_ratio(record: dict, s: Scenario, rehearsal: dict) -> float | None:
    """A scenario's host work here against its rehearsal's (CUDA start and model read taken out), for
    measured_speed."""
    seen = rehearsal.get("scenarios", {})
    base = seen.get(s.name) or seen.get(s.like or "") or {}
    if record.get("status") != "pass" or not base.get("host_s") or s.cpu_run:
        return None
    parts = record.get("estimate_parts") or {}
    here = record.get("host_s", 0.0) - parts.get("cuda_start", 0.0) - parts.get("model_read", 0.0)
    return max(here, 1.0) / base["host_s"]


def decided_on(plan: list[Scenario], runnable) -> int:
    """How many rank specs the probe decides on a GPU machine (one per scenario that trains or is refused)."""
    return sum(1 for s in plan if runnable(s) and s.kind in ("train", "resume", "refuse", "throughput"))


def probe_seconds(rehearsal: dict, speed: float, decided: int) -> tuple[float, float]:
    """(the probe, before any scenario; its decisions, beside the scenarios) on the lent machine."""
    probe = max(CUDA_PROBE_S, speed * (rehearsal.get("probe_imports_s") or 40.0))
    per = (rehearsal.get("decisions_s") or 60.0) / max(rehearsal.get("decided") or 20, 1)
    return round(probe, 1), round(speed * per * decided, 1)


def cap_of(s: Scenario, mode: Mode, est: float) -> float:
    return 900.0 if mode.device == "cpu" else max(CAP_MIN_S, CAP_FACTOR * est)


def timeline(plan: list[Scenario], mode: Mode, rehearsal: dict, runnable, speed=None, at=None) -> dict:
    """Each runnable scenario's start and end at the estimates, the background builds and the probe's decisions
    beside them. `at`: re-planned from this many seconds in, the probe done (`runnable`: those not run yet)."""
    cuda = mode.device == "cuda"
    speed = speed or measured_speed(rehearsal)
    probe, decisions = probe_seconds(rehearsal, speed, decided_on(plan, runnable)) if cuda else (0.0, 0.0)
    head = {"wheels": speed * (rehearsal.get("wheels_s") or 10.0) if cuda and at is None else 0.0}
    head["probe"], head["decisions"] = (probe if at is None else 0.0), (decisions if at is None else 0.0)
    t = (at or 0.0) + head["wheels"] + head["probe"]
    built, ready, decided_at = t, {}, t + head["decisions"]
    if cuda:
        trains = (s for s in plan if runnable(s) and s.model in ("small", "big") and s.kind not in ("paths", "refuse"))
        for model in dict.fromkeys(mode.model(s) for s in trains):
            built += build_seconds(model, rehearsal, speed)
            ready[model] = round(built, 1)
    rows = []
    for s in plan:
        if not runnable(s):
            continue
        est = estimate(s, mode, rehearsal, speed)
        needs = ready.get(mode.model(s), 0.0) if s.kind in ("train", "resume", "throughput") else 0.0
        start = max(t, needs, decided_at if s.if_refused else 0.0)
        t = start + est["seconds"]
        rows.append({"name": s.name, "start": round(start, 1), "end": round(t, 1), **est, "matters": s.matters})
    matters_end = max((r["end"] for r in rows if r["matters"]), default=t)
    return {"head": head, "builds": ready, "rows": rows, "matters_end": round(matters_end, 1), "end": round(t, 1)}


def plan_lines(plan, mode: Mode, budget: float, rehearsal: dict, runnable, speed=None, at=None) -> list[str]:
    line = timeline(plan, mode, rehearsal, runnable, speed, at)
    if at is None:
        source = rehearsal.get("source", "no rehearsal recorded")
        out = [f"time budget: {budget:.0f} s for the whole check on {mode.gpu_name} (GPU_CHECK_BUDGET_S overrides)"]
        out.append(f"  estimates from the rehearsal ({source}), scaled: {ASSUMPTIONS}")
        out.append(f"  host work x{speed or measured_speed(rehearsal)} of the rehearsal's until the probe measures it")
        out.append(
            f"  wheels ~{line['head']['wheels']:.0f} s, probe ~{line['head']['probe']:.0f} s, its decisions "
            f"~{line['head']['decisions']:.0f} s beside the scenarios"
        )
    else:
        out = [f"re-planned at {at:.0f} s, the host work x{speed} of the rehearsal's (as measured here):"]
    ready = ", ".join(f"{m} ~{t:.0f} s" for m, t in line["builds"].items())
    out.append(f"  models built in the background, ready at {ready or '-'}")
    for r in line["rows"]:
        late = "  [past the budget]" if r["end"] > budget else ""
        extra = "" if r["matters"] else "  (while time is left)"
        out.append(f"  - {r['name']}: ~{r['seconds']:.0f} s, ends ~{r['end']:.0f} s{extra}{late}")
    out.append(
        f"  what matters ends at ~{line['matters_end']:.0f} s, everything at ~{line['end']:.0f} s; a scenario starts "
        "only while the budget left covers its estimate (the rest are skipped by name)"
    )
    return out


def record(out_dir: Path, path: Path = REHEARSAL) -> dict:
    """A --cpu-smoke run's folder as the recorded rehearsal: each scenario's seconds, steps and host work."""
    summary = json.loads((out_dir / "summary.json").read_text())
    probe = json.loads((out_dir / "probe.json").read_text())
    rows = [json.loads(x) for x in (out_dir / "scenarios.jsonl").read_text().splitlines()]
    data = {
        "source": f"--cpu-smoke of {time.strftime('%Y-%m-%d')}, Python {probe['versions'].get('python')}, "
        f"torch {probe['versions'].get('torch', '?').split()[0]}, transformers "
        f"{probe['versions'].get('transformers', '?').split()[0]}",
        **{k: summary.get("timing", {}).get(k) for k in ("wheels_s", "tiny_build_s", "decisions_s", "decided")},
        "probe_imports_s": probe.get("parts", {}).get("imports_s"),
        "probe_device_s": probe.get("parts", {}).get("device_s"),
        "scenarios": {
            r["name"]: {k: r.get(k) for k in ("seconds", "steps_s", "host_s", "launches")}
            for r in rows
            if r.get("status") in ("pass", "fail") and r.get("seconds") is not None
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def h200() -> Mode:
    return Mode("cuda", 1, "NVIDIA H200", 143771, 8, 3)


def main(argv: list[str]) -> int:
    if argv[:1] == ["record"] and len(argv) == 2:
        data = record(Path(argv[1]))
        print(f"recorded {len(data['scenarios'])} scenarios into {REHEARSAL}")
        argv = ["plan"]
    if argv[:1] == ["plan"]:
        mode = h200()
        plan = scenarios(1)
        for line in plan_lines(plan, mode, BUDGET_S["cuda"], load_rehearsal(), lambda s: s.min_gpus <= 1):
            print(line)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
