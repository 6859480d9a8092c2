"""The GPU check: one prepared command for a lent GPU machine (scripts/gpu_check.sh installs the carried wheels
and runs this). DESIGN.md "Benchmarks and the GPU check" says how to run and rehearse it.

In order: the budget plan (benchmarks/gpu_budget.py: each scenario's estimate, scaled from the recorded
rehearsal); the probe (benchmarks/gpu_probe.py: the device stages, bounded, then versions, imports, members,
every scenario's rank spec decided on this machine); the builtin models built in the background; the scenarios of
benchmarks/gpu_scenarios.py in their order, each within its cap and started only while the budget left covers its
estimate. Everything lands in the output folder as it happens, so a run cut off keeps what it measured:
  gpu_check.log    the running log (everything printed here)
  probe.json       the probe's findings and the decisions
  scenarios.jsonl  one line per scenario, appended as it ends
  summary.json     rewritten after each step: statuses, checks, estimates, times
  failures.log     for each failed command: the launcher's last words and each rank log's tail
`python -m benchmarks.gpu_verdict OUT` prints the verdict table from them. `--cpu-smoke` runs the same path on
CPU with the tiny model (FSDP1 skipped by name, its flags still decided); `--only A,B` runs the scenarios whose
names contain A or B; `--out DIR` (else $OUT, else benchmarks/results/gpu_check[_cpu_smoke]/); `--plan-only`
prints the plan and stops. Exit 0 when the probe and every scenario run passed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import gpu_budget, gpu_runs, gpu_verdict
from benchmarks.gpu_builds import Builds
from benchmarks.gpu_scenarios import REPO, Mode, Scenario, args_for, build_vlm, scenarios, with_flags

TRAINS = ("train", "resume", "throughput")  # the kinds of scenario that train a model (and wait for its build)


class Out:
    """The output folder: the running log, the probe, one JSON line per scenario, the summary."""

    def __init__(self, folder: Path, fresh: bool = True):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        names = ["probe.json", "scenarios.jsonl", "summary.json", "failures.log"]
        for name in (names if fresh else []) + ([] if os.environ.get("GPU_CHECK_STARTED") else ["gpu_check.log"]):
            (folder / name).unlink(missing_ok=True)  # gpu_check.sh starts the log: it keeps its lines

    def log(self, line: str = "") -> None:
        print(line, flush=True)
        with open(self.folder / "gpu_check.log", "a") as f:
            f.write(line + "\n")

    def write(self, name: str, data: dict) -> None:
        tmp = self.folder / f".{name}.tmp"
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(self.folder / name)

    def append(self, name: str, text: str) -> None:
        with open(self.folder / name, "a") as f:
            f.write(text + "\n")


def options(argv: list[str]) -> dict:
    opts = {"cpu_smoke": "--cpu-smoke" in argv, "plan_only": "--plan-only" in argv, "only": None, "out": None}
    for flag, key in (("--only", "only"), ("--out", "out")):
        if flag in argv:
            opts[key] = argv[argv.index(flag) + 1]
    return opts


def machine_mode(cpu_smoke: bool) -> Mode:
    """This machine as the check sees it: its GPUs from nvidia-smi (as train's pre-flight reads them)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    if cpu_smoke:
        return Mode("cpu", 0, "cpu", None, steps=4, warmup=1, env=env)
    from fsdp_tune.decide.machine import probe

    machine = probe()
    names, mib = list(machine.gpu_names), list(machine.gpu_memory_mib)
    gpus = machine.gpus or len(names)
    if not (gpus and names and mib):  # no nvidia-smi: ask torch (no CUDA context: counts and properties only)
        import torch

        gpus = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(gpus)]
        mib = [torch.cuda.get_device_properties(i).total_memory // 2**20 for i in range(gpus)]
    steps = int(os.environ.get("GPU_CHECK_STEPS", "8"))
    return Mode("cuda", gpus, names[0] if names else "no GPU", min(mib) if mib else None, steps, 3, env)


def skip_reason(s: Scenario, mode: Mode, only: str | None, installed: bool = True) -> str | None:
    """Why scenario s does not run here, or None. installed=False: as if the carried wheels were installed (the
    plan, printed before them)."""
    missing = [n for n in s.needs if installed and importlib.util.find_spec(n) is None]
    if only and not any(part.strip() and part.strip() in s.name for part in only.split(",")):
        return "not in --only"
    if missing:
        return f"needs {', '.join(missing)} (not installed: make gpu-wheels)"
    if mode.device == "cpu" and s.gpu_only:
        return s.gpu_only
    if mode.gpus < s.min_gpus and (mode.device == "cuda" or s.min_gpus > 1):
        return f"needs {s.min_gpus} GPUs, {mode.gpus} here"
    return None


def probe(out: Out, mode: Mode, timing: dict) -> dict:
    """The probe (benchmarks/gpu_probe.py) before any scenario: the device stages beside the imports."""
    from benchmarks import gpu_probe

    started = time.time()
    found = gpu_probe.run(os.environ.get("GPU_CHECK_SITE"), mode.device)
    found["seconds"] = timing["probe_s"] = round(time.time() - started, 1)
    for line in gpu_probe.lines(found):
        out.log(line)
    out.log(
        f"probe: {'ok' if found['ok'] else 'FAILED'} in {found['seconds']} s (its decisions go on beside the scenarios)"
    )
    out.write("probe.json", found)
    return found


def decide(mode: Mode, plan: list[Scenario]) -> dict:
    """Every scenario's rank spec decided as `train` decides it on this machine (on CPU also for a simulated H200),
    and the flags added where the pre-flight refuses a scenario that has a way out (Scenario.if_refused)."""
    from benchmarks import gpu_probe

    started = time.time()
    h200 = Mode("cuda", 1, "NVIDIA H200", 143771, mode.steps, mode.warmup)
    items, work = [], tempfile.mkdtemp()
    for s in plan:
        if s.kind not in (*TRAINS, "refuse") or skip_reason(s, mode, None) not in (
            None,
            s.gpu_only,
        ):
            continue
        expected = "refused" if s.kind == "refuse" else "run"
        if mode.device == "cuda" or not (s.gpu_only or s.kind == "refuse"):
            items.append((s.name, args_for(s, mode), expected, False))
        if mode.device == "cpu":
            items.append((s.name, args_for(s, h200), expected, True))
    lines, failures, refused = gpu_probe.decisions(items, work)
    extra = {}
    for s in plan:  # refused here by the pre-flight, and with a way out: decided again with it
        if s.if_refused and s.name in refused and mode.device == "cuda":
            again, still, _ = gpu_probe.decisions(
                [(s.name, with_flags(args_for(s, mode), s.if_refused), "run", False)], work
            )
            why = f"{', '.join(refused[s.name])} refused it without"
            lines += [f"{x} (with {' '.join(s.if_refused)}: {why})" for x in again]
            if not still:
                extra[s.name] = s.if_refused
                failures = [f for f in failures if not f.startswith(f"{s.name}:")]
    seconds = round(time.time() - started, 1)
    return {"lines": lines, "failures": failures, "extra": extra, "seconds": seconds, "decided": len(items)}


def decisions_done(out: Out, ctx: dict) -> None:
    """The probe's decisions, once they are done (they run beside the scenarios): logged, into probe.json."""
    if "extra" in ctx:
        return
    found, got = ctx["probe"], ctx.pop("deciding").result()
    ctx["extra"] = got["extra"]
    ctx["timing"].update(decisions_s=got["seconds"], decided=got["decided"])
    found.update(decisions=got["lines"], decision_failures=got["failures"], flags_added=got["extra"])
    found["ok"] = ctx["probe_ok"] = found["ok"] and not got["failures"]
    out.log(f"decisions (each scenario's rank spec, as train decides it; {got['seconds']} s):")
    for line in got["lines"]:
        out.log(line)
    out.write("probe.json", found)


def run_one(s: Scenario, mode: Mode, out: Out, ctx: dict, i: int, left: float, est: dict) -> dict:
    """Scenario s once its model is built (and, for one with a way out of a refusal, the probe's decisions made);
    its record, with its estimate and what it took."""
    started = time.time()
    model = mode.model(s)
    if s.if_refused and "deciding" in ctx:
        decisions_done(out, ctx)
    if s.cpu_run:  # nothing else may hold the GPU while the CPU run is watched from outside
        ctx["builds"].wait_all(left)
    if s.kind in TRAINS and not ctx["builds"].wait(model, left):
        record = {"status": "fail", "checks": {f"{model} built": False}, "lines": [ctx["builds"].said(model)]}
    else:
        cap = gpu_budget.cap_of(s, mode, est["seconds"])
        cap = min(cap, max(left - (time.time() - started), 1.0)) if mode.device == "cuda" else cap
        record = gpu_runs.run(s, mode, ctx["work"] / f"s{i}", cap, ctx["results"], ctx.get("extra", {}).get(s.name, ()))
    record["seconds"] = round(time.time() - started, 1)
    record["estimate_s"], record["estimate_parts"] = est["seconds"], est["parts"]
    record["launches"] = s.launches
    record["host_s"] = round(record["seconds"] - record.get("steps_s", 0.0), 1)
    return record


def run_all(out: Out, mode: Mode, plan: list[Scenario], only: str | None, budget: float, t0: float, ctx: dict) -> dict:
    """Every scenario in order, each recorded as it ends; the summary rewritten after each."""
    results = ctx.setdefault("results", {})
    ctx.setdefault("work", Path(tempfile.mkdtemp(prefix="fsdp-tune-gpu-check-")))
    ratios: list[float] = []
    for i, s in enumerate(plan, 1):
        left = budget - (time.time() - t0)
        speed = gpu_budget.measured_speed(ctx["rehearsal"], ctx.get("imports_s"), tuple(ratios))
        est = gpu_budget.estimate(s, mode, ctx["rehearsal"], speed)
        why = skip_reason(s, mode, only) or (
            f"out of time: ~{est['seconds']:.0f} s needed, {left:.0f} s of the budget left"
            if left < est["seconds"]
            else None
        )
        out.log(
            f"[{i}/{len(plan)}] {s.name}" + (f": skipped ({why})" if why else f"  ({s.why}; ~{est['seconds']:.0f} s)")
        )
        if why:
            record = {"status": "skipped", "why": why, "estimate_s": est["seconds"]}
        else:
            record = run_one(s, mode, out, ctx, i, left, est)
            for line in record.get("lines", []):
                out.log(f"    {line}")
            for name, ok in record.get("checks", {}).items():
                out.log(f"    {'PASS' if ok else 'FAIL'}  {name}")
            for name, met in record.get("goals", {}).items():
                out.log(f"    {'GOAL met    ' if met else 'GOAL NOT met'}  {name}")
            out.log(
                f"    => {record['status'].upper()} in {record['seconds']} s (estimated {record['estimate_s']:.0f} s)"
            )
            if record.get("failure"):
                out.append("failures.log", f"=== {s.name}\n{record['failure']}")
                record["failure"] = record["failure"][-2000:]
            ratio = gpu_budget.host_ratio(record, s, ctx["rehearsal"]) if mode.device == "cuda" else None
            ratios += [ratio] if ratio else []
        results[s.name] = {"name": s.name, "kind": s.kind, "why_it_matters": s.why, "matters": s.matters, **record}
        out.append("scenarios.jsonl", json.dumps(results[s.name], default=str))
        out.write("summary.json", summary(mode, results, budget, t0, i == len(plan), ctx))
    return results


def summary(mode: Mode, results: dict, budget: float, t0: float, finished: bool, ctx: dict) -> dict:
    count = {k: sum(r["status"] == k for r in results.values()) for k in ("pass", "fail", "skipped")}
    keys = ("status", "seconds", "estimate_s", "why", "checks", "goals", "tokens_per_s", "mfu")
    short = {n: {k: r.get(k) for k in keys if r.get(k) is not None} for n, r in results.items()}
    machine = {"device": mode.device, "gpu": mode.gpu_name, "gpus": mode.gpus, "gpu_mib": mode.gpu_mib}
    timing = {**ctx.get("timing", {}), "builds": ctx["builds"].record() if "builds" in ctx else {}}
    head = {"machine": machine, "budget_s": budget, "elapsed_s": round(time.time() - t0, 1), "finished": finished}
    return {**head, "probe_ok": ctx.get("probe_ok"), **count, "timing": timing, "scenarios": short}


def _cuda_ready(out: Out) -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    out.log(
        f"error: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU: the scenarios need one "
        "(a CUDA build of torch and the driver; CUDA_VISIBLE_DEVICES); --cpu-smoke runs on CPU"
    )
    return False


def main(argv: list[str]) -> int:
    opts = options(argv)
    t0 = float(os.environ.get("GPU_CHECK_STARTED") or time.time())
    mode = machine_mode(opts["cpu_smoke"])
    default = "gpu_check_cpu_smoke" if opts["cpu_smoke"] else "gpu_check"
    folder = Path(opts["out"] or os.environ.get("OUT") or REPO / "benchmarks" / "results" / default)
    out = Out(folder, fresh=not opts["plan_only"])
    budget = float(os.environ.get("GPU_CHECK_BUDGET_S") or gpu_budget.BUDGET_S[mode.device])
    plan, rehearsal = scenarios(mode.gpus), gpu_budget.load_rehearsal()
    if not os.environ.get("GPU_CHECK_PLANNED"):  # gpu_check.sh prints the plan before the wheels
        runnable = lambda s: not skip_reason(s, mode, opts["only"], installed=not opts["plan_only"])  # noqa: E731
        for line in gpu_budget.plan_lines(plan, mode, budget, rehearsal, runnable):
            out.log(line)
    if opts["plan_only"]:
        return 0
    timing = {"wheels_s": float(os.environ["GPU_CHECK_WHEELS_S"]) if os.environ.get("GPU_CHECK_WHEELS_S") else None}
    ctx = {"rehearsal": rehearsal, "timing": timing, "results": {}}
    out.write("summary.json", summary(mode, {}, budget, t0, False, ctx))
    ctx["probe"] = found = probe(out, mode, timing)
    ctx["probe_ok"], ctx["imports_s"] = found["ok"], found["parts"]["imports_s"]
    if mode.device == "cuda" and not _cuda_ready(out):
        return 2
    runnable = [s for s in plan if not skip_reason(s, mode, opts["only"])]
    if any(s.model == "vlm" for s in plan):  # a folder, not a builtin: there before its spec is decided (decide()
        # decides every scenario's, --only or not)
        started = time.time()
        ok, said = build_vlm(sys.executable)
        timing["vlm_build_s"] = round(time.time() - started, 1)
        out.log(f"vision model {'ok' if ok else 'FAILED'} in {timing['vlm_build_s']} s: {said}")
    ctx["deciding"] = ThreadPoolExecutor(1).submit(decide, mode, plan)
    wanted = [mode.model(s) for s in runnable if s.kind in TRAINS]
    ctx["builds"] = Builds(list(dict.fromkeys(wanted)), out.log, mode.device == "cuda")
    if mode.device == "cpu":  # the rehearsal's tiny build, timed (the estimates scale it)
        ctx["builds"].wait_all(900)
        timing["tiny_build_s"] = ctx["builds"].record().get("builtin:tiny-llama", {}).get("seconds")
    speed = gpu_budget.measured_speed(rehearsal, ctx["imports_s"])
    if mode.device == "cuda":
        for line in gpu_budget.plan_lines(
            plan, mode, budget, rehearsal, runnable.__contains__, speed, time.time() - t0
        ):
            out.log(line)
    results = run_all(out, mode, plan, opts["only"], budget, t0, ctx)
    if "deciding" in ctx:  # every scenario skipped: the decisions still go into probe.json
        decisions_done(out, ctx)
    ctx["builds"].wait_all(1)
    out.write("summary.json", summary(mode, results, budget, t0, True, ctx))
    out.log("")
    for line in gpu_verdict.table(out.folder):
        out.log(line)
    out.log(f"results in {out.folder}; the table again: python -m benchmarks.gpu_verdict {out.folder}")
    failed = any(r["status"] == "fail" for r in results.values())
    return 0 if ctx["probe_ok"] and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
