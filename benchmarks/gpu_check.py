"""The GPU check: one prepared command for a lent GPU machine (scripts/gpu_check.sh installs the carried wheels
and runs this). DESIGN.md "Benchmarks and the GPU check" says how to run and rehearse it.

In order: the time budget; the compatibility probe (benchmarks/gpu_probe.py: versions, every import and member
fsdp-tune uses, then every scenario's rank spec decided on this machine and its SFTConfig built: seconds, no
model); the model build; then the scenarios of benchmarks/gpu_scenarios.py, most important first, each within
its cap and started only while the budget has room for its estimate. Everything lands in the output folder as
it happens, so a run cut off keeps what it measured:
  gpu_check.log    the running log (everything printed here)
  probe.json       the probe's findings and the decisions
  scenarios.jsonl  one line per scenario, appended as it ends
  summary.json     rewritten after each step: statuses, checks, times
  failures.log     for each failed command: the launcher's last words and each rank log's tail
`--cpu-smoke` runs the same path on CPU with the tiny model (GPU-only scenarios skipped by name, their flags
still decided); `--only A,B` runs the scenarios whose names contain A or B; `--out DIR` (else $OUT, else
benchmarks/results/gpu_check[_cpu_smoke]/). Exit 0 when every scenario run passed every check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import gpu_runs
from benchmarks.gpu_scenarios import REPO, Mode, Scenario, args_for, run_group, scenarios

BUDGET_S = {"cuda": 360, "cpu": 3600}  # the whole check; GPU_CHECK_BUDGET_S overrides
CPU_CAP_S = 900  # a scenario's cap on CPU (a loaded CI machine), instead of its GPU cap
MODEL_BUILD_CAP_S = 180


class Out:
    """The output folder: the running log, the probe, one JSON line per scenario, the summary."""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        names = ["probe.json", "scenarios.jsonl", "summary.json", "failures.log"]
        for name in names + ([] if os.environ.get("GPU_CHECK_STARTED") else ["gpu_check.log"]):
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
    opts = {"cpu_smoke": "--cpu-smoke" in argv, "only": None, "out": None}
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
    if not (gpus and names and mib):  # no nvidia-smi: ask torch
        import torch

        gpus = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(gpus)]
        mib = [torch.cuda.get_device_properties(i).total_memory // 2**20 for i in range(gpus)]
    steps = int(os.environ.get("GPU_CHECK_STEPS", "8"))
    return Mode("cuda", gpus, names[0] if names else "no GPU", min(mib) if mib else None, steps, 3, env)


def skip_reason(s: Scenario, mode: Mode, only: str | None) -> str | None:
    missing = [n for n in s.needs if importlib.util.find_spec(n) is None]
    if only and not any(part.strip() and part.strip() in s.name for part in only.split(",")):
        return "not in --only"
    if missing:
        return f"needs {', '.join(missing)} (not installed: make gpu-wheels)"
    if mode.device == "cpu" and s.gpu_only:
        return s.gpu_only
    if mode.gpus < s.min_gpus and (mode.device == "cuda" or s.min_gpus > 1):
        return f"needs {s.min_gpus} GPUs, {mode.gpus} here"
    return None


def cap_of(s: Scenario, mode: Mode) -> float:
    return float(CPU_CAP_S if mode.device == "cpu" else s.cap_s)


def budget_lines(plan: list[Scenario], mode: Mode, budget: float) -> list[str]:
    out = [f"time budget: {budget:.0f} s for the whole check on {mode.gpu_name} (GPU_CHECK_BUDGET_S overrides);"]
    out.append(f"  probe ~15 s, model build ~30 s, then {len(plan)} scenarios, each ~estimate on one H200 (cap):")
    spent = 45
    for i, s in enumerate(plan, 1):
        spent += s.est_s
        late = "  [past the budget at these estimates]" if spent > budget else ""
        out.append(f"  {i:>2}. {s.name}: ~{s.est_s} s (cap {cap_of(s, mode):.0f} s)  {s.why or 'GPU path'}{late}")
    out.append("  a scenario starts only while the budget left covers its estimate; the rest are skipped by name")
    return out


def build_model(name: str, out: Out, cap: float) -> bool:
    """A builtin model's folder, built once (the launcher would build it on first use; here it is timed)."""
    from fsdp_tune.sources.builtin import VERSION, cache_dir

    short = name.removeprefix("builtin:")
    target = cache_dir() / f"{short}-v{VERSION}"
    if not name.startswith("builtin:") or target.is_dir():
        return True
    started = time.time()
    target.parent.mkdir(parents=True, exist_ok=True)
    done = run_group([sys.executable, "-m", "fsdp_tune.models.tiny", short, str(target)], os.environ, cap)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) / 2**30 if target.is_dir() else 0
    verdict = "" if done.returncode == 0 else " FAILED"
    out.log(f"built {name} in {time.time() - started:.1f} s ({size:.2f} GiB written){verdict}")
    if done.returncode:
        out.append("failures.log", f"=== build {name}\n{done.stderr[-3000:]}")
    return done.returncode == 0


def probe(out: Out, mode: Mode, plan: list[Scenario]) -> bool:
    """The compatibility probe and every scenario's decisions (probe.json); False when something failed."""
    from benchmarks import gpu_probe

    started = time.time()
    found = gpu_probe.run(os.environ.get("GPU_CHECK_SITE"), mode.device == "cuda")
    items = []
    h200 = Mode("cuda", 1, "NVIDIA H200", 143771, mode.steps, mode.warmup)
    for s in plan:  # on CPU also each scenario's GPU command, decided for a simulated H200
        if s.kind not in ("train", "resume", "refuse") or skip_reason(s, mode, None) not in (None, s.gpu_only):
            continue
        expected = "refused" if s.kind == "refuse" else "run"
        if mode.device == "cuda" or not (s.gpu_only or s.kind == "refuse"):
            items.append((s.name, args_for(s, mode), expected, False))
        if mode.device == "cpu":
            items.append((s.name, args_for(s, h200), expected, True))
    found["decisions"], found["decision_failures"] = gpu_probe.decisions(items, tempfile.mkdtemp())
    found["ok"] = found["ok"] and not found["decision_failures"]
    found["seconds"] = round(time.time() - started, 1)
    for line in gpu_probe.lines(found) + ["decisions (each scenario's rank spec, as train decides it):"]:
        out.log(line)
    for line in found["decisions"]:
        out.log(line)
    out.log(f"probe: {'ok' if found['ok'] else 'FAILED'} in {found['seconds']} s")
    out.write("probe.json", found)
    return found["ok"]


def run_all(out: Out, mode: Mode, plan: list[Scenario], only: str | None, budget: float, t0: float) -> dict:
    """Every scenario in order, each recorded as it ends; the summary rewritten after each."""
    results: dict[str, dict] = {}
    work = Path(tempfile.mkdtemp(prefix="fsdp-tune-gpu-check-"))
    for i, s in enumerate(plan, 1):
        left = budget - (time.time() - t0)
        why = skip_reason(s, mode, only) or (
            f"out of time: ~{s.est_s} s needed, {left:.0f} s of the budget left" if left < s.est_s else None
        )
        out.log(f"[{i}/{len(plan)}] {s.name}" + (f": skipped ({why})" if why else f"  ({s.why or 'GPU path'})"))
        if why:
            record = {"status": "skipped", "why": why}
        else:
            started = time.time()
            if s.model == "big" and not build_model(mode.model(s), out, min(cap_of(s, mode), left)):
                record = {"status": "fail", "checks": {f"{mode.model(s)} built": False}, "lines": []}
            else:
                cap = min(cap_of(s, mode), max(left, 1.0) if mode.device == "cuda" else cap_of(s, mode))
                record = gpu_runs.run(s, mode, work / f"s{i}", cap, results)
            record["seconds"] = round(time.time() - started, 1)
            for line in record.get("lines", []):
                out.log(f"    {line}")
            for name, ok in record.get("checks", {}).items():
                out.log(f"    {'PASS' if ok else 'FAIL'}  {name}")
            out.log(f"    => {record['status'].upper()} in {record['seconds']} s")
            if record.get("failure"):
                out.append("failures.log", f"=== {s.name}\n{record['failure']}")
                record["failure"] = record["failure"][-2000:]
        results[s.name] = {"name": s.name, "kind": s.kind, "why_it_matters": s.why, **record}
        out.append("scenarios.jsonl", json.dumps(results[s.name], default=str))
        out.write("summary.json", summary(mode, results, budget, t0, finished=i == len(plan)))
    return results


def summary(mode: Mode, results: dict, budget: float, t0: float, finished: bool) -> dict:
    count = {k: sum(r["status"] == k for r in results.values()) for k in ("pass", "fail", "skipped")}
    short = {
        n: {k: r.get(k) for k in ("status", "seconds", "why", "checks", "tokens_per_s", "mfu") if r.get(k) is not None}
        for n, r in results.items()
    }
    machine = {"device": mode.device, "gpu": mode.gpu_name, "gpus": mode.gpus, "gpu_mib": mode.gpu_mib}
    head = {"machine": machine, "budget_s": budget, "elapsed_s": round(time.time() - t0, 1), "finished": finished}
    return {**head, **count, "scenarios": short}


def report(out: Out, results: dict, probe_ok: bool, t0: float) -> int:
    out.log("")
    out.log(f"{'scenario':<62} {'status':<8} {'s':>5} {'tok/s':>8} {'MFU':>6} {'peak':>6} {'plan':>6}  (GiB)")
    for name, r in results.items():
        peak = r.get("peak_allocated_gib") or r.get("peak_rss_gib")  # allocated on a GPU, RSS per rank on CPU
        planned = r.get("planned_allocated_gib") or r.get("planned_host_per_rank_gib")
        cells = [r.get("tokens_per_s"), r.get("mfu"), peak, planned]
        fmt = [",.0f", ".1%", ".2f", ".2f"]
        text = [format(v, f) if isinstance(v, (int, float)) else "-" for v, f in zip(cells, fmt, strict=True)]
        seconds = f"{r['seconds']:.0f}" if "seconds" in r else "-"
        out.log(f"{name[:62]:<62} {r['status']:<8} {seconds:>5} {text[0]:>8} {text[1]:>6} {text[2]:>6} {text[3]:>6}")
    count = {k: sum(r["status"] == k for r in results.values()) for k in ("pass", "fail", "skipped")}
    out.log(
        f"probe {'ok' if probe_ok else 'FAILED'}; scenarios: {count['pass']} passed, {count['fail']} failed, "
        f"{count['skipped']} skipped; {time.time() - t0:.0f} s in all"
    )
    return 0 if probe_ok and not count["fail"] else 1


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
    out = Out(Path(opts["out"] or os.environ.get("OUT") or REPO / "benchmarks" / "results" / default))
    budget = float(os.environ.get("GPU_CHECK_BUDGET_S") or BUDGET_S[mode.device])
    plan = scenarios(mode.gpus)
    for line in budget_lines(plan, mode, budget):
        out.log(line)
    out.write("summary.json", summary(mode, {}, budget, t0, finished=False))
    probe_ok = probe(out, mode, plan)
    if mode.device == "cuda" and not _cuda_ready(out):
        return 2
    small = "builtin:tiny-llama" if mode.device == "cpu" else mode.model(plan[1])
    for name in dict.fromkeys([small, "builtin:tiny-llama"]):
        build_model(name, out, MODEL_BUILD_CAP_S if mode.device == "cuda" else CPU_CAP_S)
    results = run_all(out, mode, plan, opts["only"], budget, t0)
    code = report(out, results, probe_ok, t0)
    out.log(f"results in {out.folder}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
