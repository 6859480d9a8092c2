"""Running and judging one GPU-check scenario: a training command, what it left, and the checks on it
(benchmarks/gpu_criteria.py); resumes, the refusal and gpu_paths in benchmarks/gpu_kinds.py.

run() returns the scenario's record: "status" pass | fail, "checks" (name -> bool, each printed PASS/FAIL), "goals"
(the throughput target: reported, not counted), "lines" (what the log shows), the measurements, and "failure" (the
launcher's and ranks' last words) when a command failed.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import gpu_criteria as crit
from benchmarks import gpu_measures as meas
from benchmarks.gpu_proc import GpuWatch, cli, failure_text, metrics, plan, read_json, stand_in_nvidia_smi
from benchmarks.gpu_scenarios import THROUGHPUT_SHAPE, Mode, Scenario, args_for, with_flags
from fsdp_tune.decide.spec import from_dict, upgraded
from fsdp_tune.runfiles import RESOLVED_NAME, SUMMARY_NAME

MFU_GOAL = 0.40  # BENCHMARKS.md's target for bf16 LoRA on the 8B-class model, at 4N


class Clock:
    """The scenario's cap, shared by the commands it runs."""

    def __init__(self, cap: float):
        self.end = time.time() + cap

    def left(self) -> float:
        return max(self.end - time.time(), 1.0)


def run(s: Scenario, mode: Mode, work: Path, cap: float, done: dict, extra: tuple[str, ...] = ()) -> dict:
    """Scenario `s` within `cap` seconds; `done`: the records of the scenarios already run (pairs, references);
    `extra`: flags added on this machine (Scenario.if_refused, when the probe found the scenario refused)."""
    from benchmarks import gpu_kinds

    kinds = {"train": train, "throughput": throughput, **gpu_kinds.KINDS}
    record = kinds[s.kind](s, mode, work, Clock(cap), done, extra)
    record["status"] = "pass" if record["checks"] and all(record["checks"].values()) else "fail"
    return record


def one(s: Scenario, mode: Mode, out: Path, clock: Clock, steps: int | None = None, extra=()) -> dict:
    """One training command and what it left: {"ok", "summary", "resolved", "metrics", "plan", "watch", ...}."""
    args = with_flags(args_for(s, mode, steps), extra)
    on_cpu = mode.device == "cpu" or s.cpu_run
    env = mode.env
    if s.cpu_run and mode.device == "cpu":  # rehearse the outside watch against a stand-in nvidia-smi
        env = {**env, "PATH": f"{stand_in_nvidia_smi(out.parent / 'bin')}:{env.get('PATH', '')}"}
    watch = GpuWatch(env) if s.cpu_run else None
    with ThreadPoolExecutor(1) as pool:  # the plan (seconds of CPU) beside the run's start, not before it
        planning = pool.submit(plan, args, mode.gpu_name, mode.gpu_mib, on_cpu, mode.env, min(120.0, clock.left()))
        if watch:
            with watch:
                proc = cli(["train", *args, "--output_dir", str(out)], mode.env, clock.left())
        else:
            proc = cli(["train", *args, "--output_dir", str(out)], mode.env, clock.left())
        planned = planning.result()
    got = {"plan": planned, "args": args, "exit": proc.returncode, "watch": watch, "metrics": metrics(out)}
    if proc.returncode or not (out / SUMMARY_NAME).exists():
        return {**got, "ok": False, "failure": failure_text(proc, out)}
    return {**got, "ok": True, "summary": read_json(out / SUMMARY_NAME), "resolved": read_json(out / RESOLVED_NAME)}


def steps_seconds(rows: list[dict]) -> float:
    """The steps' share of a launch: its logged steps' span, the first step counted as the mean one."""
    timed = [r["time"] for r in rows if "loss" in r and "time" in r]
    return (timed[-1] - timed[0]) * len(timed) / (len(timed) - 1) if len(timed) > 1 else 0.0


def recomputes(resolved: dict) -> bool:
    """Whether the run recomputed activations (FSDP's or the Trainer's checkpointing), as its rank spec says; a
    run without a readable spec is counted as recomputing (MFU's higher FLOP count)."""
    plain = resolved.get("spec")
    return from_dict(upgraded(plain)).checkpointing != "off" if isinstance(plain, dict) else True


def measures(s: Scenario, mode: Mode, got: dict) -> dict:
    """tokens/s and MFU, and the checks every training command gets: trained with its adapter whole, the plan,
    memory against it (GPU), the loading path and where the parameters are as the rank reports them."""
    summary, planned, resolved = got["summary"], got["plan"], got["resolved"]
    on_cpu = mode.device == "cpu" or s.cpu_run
    _, warmup = mode.steps_of(s)
    tps = meas.tokens_per_s(got["metrics"], warmup)
    peak = meas.peak_tflops(mode.gpu_name) if not on_cpu else None
    recompute = recomputes(resolved)
    mfu = meas.mfu(tps, planned.get("total_params") or 0, recompute, peak, mode.world(s))
    loading = (summary.get("extra") or {}).get("loading") or {}
    rank0 = (summary.get("per_rank") or [{}])[0]
    checks, lines = {}, []
    for name, (ok, line) in {
        "trained, adapter checked whole": crit.adapter_whole(summary),
        "loading path as decided, from the rank": crit.loading(summary, resolved, s.loading),
        "parameters where the spec put them, from the rank": crit.placement(summary, resolved, s.asks_offload),
    }.items():
        checks[name] = ok
        lines.append(line)
    memory_ok, memory_line = crit.memory(summary, planned, on_cpu)
    if planned.get("error"):  # no plan, no memory verdict: that is a failure of its own
        checks["fsdp-tune plan for the same flags"] = False
        lines.append(f"plan failed: {planned['error'][-300:]}")
    if memory_ok is not None and not on_cpu:  # on CPU printed, not counted: RSS is mostly the libraries' own
        checks["memory within 15% of the plan"] = memory_ok
    losses = summary.get("losses") or []
    lines = [
        f"trained {summary.get('steps')} steps, loss {_loss(losses[:1])} -> {_loss(losses[-1:])}; "
        f"mesh {summary.get('mesh')}; tokens/s {tps or 0:,.0f}; MFU {mfu['formula']}",
        *lines,
        memory_line,
    ]
    return {
        "loading": loading.get("path"),
        "losses": losses,
        "tokens_per_s": tps,
        "mfu": mfu["mfu"],
        "hardware_flops_share": mfu["hardware"],
        "mfu_formula": mfu["formula"],
        "peak_allocated_gib": (rank0.get("peak_gpu_allocated_mib") or 0) / 1024 or None,
        "peak_rss_gib": (rank0.get("peak_rss_mib") or 0) / 1024,
        "planned_allocated_gib": planned.get("peak_allocated_gib"),
        "planned_host_per_rank_gib": planned.get("per_rank_host_peak_gib"),
        "memory_ok": memory_ok,
        "steps_s": round(steps_seconds(got["metrics"]), 2),
        "checks": checks,
        "lines": lines,
    }


def _loss(values: list) -> str:
    return f"{values[0]:.3f}" if values else "-"


def failed(got: dict, what: str) -> dict:
    return {
        "checks": {what: False},
        "failure": got["failure"],
        "lines": [f"{what}: FAILED (exit {got['exit']}); see failures.log"],
        "steps_s": round(steps_seconds(got.get("metrics") or []), 2),
    }


def add(record: dict, name: str, judged: tuple[bool | None, str], counted: bool = True) -> None:
    """A check's line into the record, and its verdict where it counts (None counts as a failure: not measured)."""
    ok, line = judged
    record["lines"].append(line + ("" if counted else " (printed, not counted here)"))
    if counted:
        record["checks"][name] = bool(ok)


def train(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict, extra=()) -> dict:
    got = one(s, mode, work / "run", clock, extra=extra)
    if not got["ok"]:
        return failed(got, "trained")
    record = {**measures(s, mode, got), "reference_of": s.reference}
    if s.data == "prompts":
        add(record, "GRPO: every step generated and scored", crit.grpo_steps(got["metrics"], mode.steps_of(s)[0]))
    if s.data == "images":
        add(record, "vision: trained on its images", crit.images_trained(got["summary"], got["resolved"]))
    if s.cpu_run:  # what the GPU saw, from outside the run
        watch = got["watch"]
        counted = mode.device == "cuda"
        judged = crit.no_gpu_use(watch.baseline, watch.samples)
        add(record, "no GPU memory used (nvidia-smi, outside the rank)", judged, counted)
    if s.same_as:
        other = done.get(s.same_as) or {}
        add(
            record,
            f"a pair: two loading paths with {s.same_as}",
            crit.different_paths(record["loading"], other.get("loading"), s.same_as),
        )
        tol = crit.LOSS_TOLERANCE[mode.device]
        add(record, f"losses as {s.same_as}", crit.same_losses(record["losses"], other.get("losses"), tol, s.same_as))
    partner = s.reference or next((n for n, r in done.items() if r.get("reference_of") == s.name), None)
    if partner and partner in done:  # the later of the two compares (the GPU run against the CPU reference)
        other = done[partner]
        judged = crit.same_losses(record["losses"], other.get("losses"), crit.REFERENCE_TOLERANCE, partner)
        add(record, f"losses as {partner} (the CPU reference)", judged, counted=mode.device == "cuda")
    return record


def throughput(s: Scenario, mode: Mode, work: Path, clock: Clock, done: dict, extra=()) -> dict:
    """The 8B run at NeMo AutoModel's shape: steady steps, MFU at 4N beside their figure, the goal reported."""
    steps, warmup = mode.steps_of(s)
    got = one(s, mode, work / "run", clock, steps, extra)
    if not got["ok"]:
        return failed(got, "trained")
    record = measures(s, mode, got)
    times = crit.step_times(got["metrics"], warmup)
    add(record, "steady over the timed steps", crit.steady(times, mode.device), counted=mode.device == "cuda")
    world = mode.world(s)
    shape = {**THROUGHPUT_SHAPE, "global_batch": THROUGHPUT_SHAPE["micro_batch"] * world}
    shape.update(
        seq=int(_flag(got["args"], "--max_seq_len")),
        micro_batch=int(_flag(got["args"], "--per_device_train_batch_size")),
    )
    record["lines"] += meas.nemo_comparison(record["tokens_per_s"], record["mfu"], mode.gpu_name, shape)
    record["step_times"] = [round(t, 4) for t in times]
    if mode.device == "cuda":
        value = record["mfu"]
        record["goals"] = {
            f"MFU at 4N at least {MFU_GOAL:.0%} (BENCHMARKS.md's target)": bool(value and value >= MFU_GOAL)
        }
    return record


def _flag(args: list[str], key: str) -> str:
    return args[len(args) - 1 - args[::-1].index(key) + 1]  # the last one given
