"""The GPU check's pass/fail criteria, each a pure function of what a run left (its summary, its resolved rank spec,
its metrics, what nvidia-smi showed from outside): (ok, the line the log prints). ok is None where nothing can be
judged; the caller decides whether that counts (on a GPU it does: what cannot be measured has not passed).
tests/unit/test_gpu_criteria.py makes each one fail on a doctored result. No torch."""

from __future__ import annotations

import statistics

MEMORY_TOLERANCE = 0.15  # measured peak allocated vs the plan
LOSS_TOLERANCE = {"cuda": 0.02, "cpu": 1e-3}  # a pair of paths, relative per step: GPU kernels are not bitwise stable
REFERENCE_TOLERANCE = 1e-3  # fp32 on the GPU vs the same run on the CPU: only the kernels' summation order differs
GPU_USE_MIB = 64  # a CUDA context alone takes hundreds of MiB: more than this over the baseline is a process on it
PLACE_SHARE = 0.99  # of a rank's parameter bytes, where the spec put them
STEADY_CV = 0.10  # step time's coefficient of variation over the timed steps
MIN_TIMED_STEPS = {"cuda": 10, "cpu": 2}


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def adapter_whole(summary: dict) -> tuple[bool, str]:
    check = summary.get("adapter_check") or {}
    ok = bool(check.get("ok"))
    return ok, f"adapter: {check.get('lora_tensors', 0)} LoRA tensors, {'whole and trained' if ok else 'BROKEN'}"


def memory(summary: dict, planned: dict, on_cpu: bool) -> tuple[bool | None, str]:
    """Measured peak against the plan, within MEMORY_TOLERANCE: peak allocated on a GPU, RSS per rank on CPU."""
    ranks = summary.get("per_rank") or []
    if on_cpu:
        measured = max((r.get("peak_rss_mib") or 0) for r in ranks) / 1024 if ranks else None
        want, what = planned.get("per_rank_host_peak_gib"), "peak RSS per rank"
    else:
        measured = max((r.get("peak_gpu_allocated_mib") or 0) for r in ranks) / 1024 if ranks else None
        want, what = planned.get("peak_allocated_gib"), "peak allocated"
    if not measured or not want:
        return None, f"memory: {what} {measured or '-'} GiB, plan {want or '-'}: not compared"
    off = measured / want - 1
    ok = abs(off) <= MEMORY_TOLERANCE
    line = f"memory: {what} {measured:.2f} GiB vs plan {want:.2f} GiB ({off:+.0%}): {_verdict(ok)}"
    return ok, line + f" (within {MEMORY_TOLERANCE:.0%}{'; not counted on CPU' if on_cpu else ''})"


def loading(summary: dict, resolved: dict, expected: str | None) -> tuple[bool, str]:
    """The rank loaded on the path its spec decided (and the scenario names, if it does), as the rank reports it; a
    sharded load read tensors. A silent fall-back to from_pretrained fails here."""
    did = (summary.get("extra") or {}).get("loading") or {}
    decided = ((resolved.get("spec") or {}).get("loading") or {}).get("path")
    path, read = did.get("path"), did.get("tensors_read")
    problems = []
    if path != decided:
        problems.append(f"the rank loaded on {path!r}, its spec decided {decided!r} ({did.get('note') or 'no note'})")
    if expected and decided != expected:
        problems.append(f"the spec decided {decided!r}, the scenario is for {expected!r}")
    if path == "sharded" and not read:
        problems.append("sharded loading read no tensors")
    said = f"loading: the rank took {path!r}" + (f" ({read} tensors read)" if path == "sharded" else "")
    return not problems, said + (f": FAIL ({'; '.join(problems)})" if problems else ": as decided, PASS")


def expected_place(resolved: dict, asked_offload: bool) -> str | None:
    """Where the spec puts a rank's parameters: "cpu" (a CPU run), "host" (cpu_offload on a GPU), "cuda". None
    when the scenario asked for cpu_offload on a GPU and the spec dropped it."""
    spec = resolved.get("spec") or {}
    if spec.get("device") == "cpu":
        return "cpu"
    offload = bool(((spec.get("loading") or {}).get("transformers_fsdp_config") or {}).get("cpu_offload"))
    if asked_offload and not offload:
        return None
    return "host" if offload else "cuda"


def placement(summary: dict, resolved: dict, asked_offload: bool) -> tuple[bool, str]:
    """Every rank's parameter bytes where the spec put them (PLACE_SHARE of them at least), as each rank measured
    its own storage at the first step (worker/loading/report.py params_by_place)."""
    want = expected_place(resolved, asked_offload)
    ranks = ((summary.get("extra") or {}).get("loading") or {}).get("per_rank") or []
    places = [r.get("params_mib_by_place") for r in ranks]
    if want is None:
        return False, "parameters: FAIL (cpu_offload was asked for and the spec does not offload)"
    if not places or any(not p for p in places):
        return False, "parameters: FAIL (a rank did not say where its parameters are)"
    shares, pinned = [], []
    for p in places:
        total = sum(p.values()) or 1.0
        host = p.get("cpu", 0.0) + p.get("cpu_pinned", 0.0)
        shares.append((host if want in ("host", "cpu") else p.get("cuda", 0.0)) / total)
        pinned.append(p.get("cpu_pinned", 0.0) / total)
    ok = min(shares) >= PLACE_SHARE
    where = {"host": "in host memory (cpu_offload)", "cpu": "on the CPU", "cuda": "on the GPU"}[want]
    line = f"parameters {where}: {min(shares):.1%} of the least placed rank's bytes"
    line += f", {min(pinned):.0%} pinned" if want == "host" else ""
    return ok, f"{line} (by rank: {places}): {_verdict(ok)}"


def same_losses(mine: list, other: list | None, tolerance: float, what: str) -> tuple[bool | None, str]:
    """Step by step within `tolerance` (relative), the same number of steps, at least two."""
    if not other:
        return None, f"losses vs {what}: not compared ({what} has no losses)"
    if len(mine) != len(other) or len(mine) < 2:
        return False, f"losses vs {what}: {len(mine)} steps against {len(other)}: FAIL"
    diff = max(abs(a - b) / max(abs(b), 1e-9) for a, b in zip(mine, other, strict=True))
    ok = diff <= tolerance
    return ok, (
        f"losses vs {what}: max relative difference {diff:.1e} over {len(mine)} steps "
        f"(tolerance {tolerance:.0e}): {_verdict(ok)}"
    )


def different_paths(mine: str | None, other: str | None, what: str) -> tuple[bool, str]:
    """A pair compares two paths: the same path twice would pass for nothing."""
    ok = bool(mine and other and mine != other)
    return ok, f"pair: loading {mine!r} here, {other!r} in {what}: {'two paths: PASS' if ok else 'NOT two paths: FAIL'}"


def no_gpu_use(baseline: dict, samples: list[dict], limit_mib: float = GPU_USE_MIB) -> tuple[bool | None, str]:
    """nvidia-smi from outside the run: the GPU's memory in use never rose over the baseline by more than limit_mib
    and no new process held a CUDA context. None when nvidia-smi gave no reading."""
    used = [s["used_mib"] for s in samples if s.get("used_mib") is not None]
    if baseline.get("used_mib") is None or not used:
        return None, f"GPU use from outside: not measured ({len(samples)} nvidia-smi samples, none with a reading)"
    rise = max(used) - baseline["used_mib"]
    new = sorted({a for s in samples for a in s.get("apps", [])} - set(baseline.get("apps", [])))
    ok = rise <= limit_mib and not new
    line = f"GPU use from outside (nvidia-smi, {len(used)} samples): memory in use rose {rise:+.0f} MiB"
    line += f" (limit {limit_mib:.0f}), processes on the GPU: {new or 'none new'}"
    return ok, f"{line}: {_verdict(ok)}"


def step_times(rows: list[dict], warmup: int) -> list[float]:
    """The timed steps' durations: each logged step's time after the warm-up steps."""
    timed = [r for r in rows if "loss" in r and "time" in r]
    return [b["time"] - a["time"] for a, b in zip(timed[max(warmup, 1) - 1 :], timed[max(warmup, 1) :], strict=False)]


def steady(times: list[float], device: str) -> tuple[bool, str]:
    """Enough timed steps, and step time steady over them (a throughput figure of a run still warming up, or of
    one stalling, is not a throughput)."""
    need = MIN_TIMED_STEPS[device]
    if len(times) < need:
        return False, f"steady: {len(times)} timed steps, {need} needed: FAIL"
    mean = statistics.fmean(times)
    cv = statistics.pstdev(times) / mean if mean > 0 else float("inf")
    ok = cv <= STEADY_CV
    return ok, (
        f"steady: {len(times)} timed steps of {mean:.3f} s (min {min(times):.3f}, max {max(times):.3f}), "
        f"variation {cv:.1%} (limit {STEADY_CV:.0%}): {_verdict(ok)}"
    )


def grpo_steps(rows: list[dict], steps: int) -> tuple[bool, str]:
    """Every step of a GRPO run generated completions and scored them: a finite reward and a completion length
    above 0 logged at each of `steps` steps (a generation that hangs, returns nothing or a reward that never
    reaches the loss fails here)."""
    import math

    scored = [r for r in rows if "reward" in r]
    finite = [r for r in scored if isinstance(r["reward"], int | float) and math.isfinite(r["reward"])]
    lengths = [r.get("completions/mean_length") or 0 for r in scored]
    ok = len(finite) == len(scored) == steps and all(n > 0 for n in lengths)
    shown = ", ".join(f"{r['reward']:.3f}" for r in finite[:8])
    return ok, (
        f"GRPO: {len(scored)} of {steps} steps scored, {len(finite)} finite (rewards {shown}), completion lengths "
        f"{min(lengths, default=0):.1f} to {max(lengths, default=0):.1f}: {_verdict(ok)}"
    )


def images_trained(summary: dict, resolved: dict) -> tuple[bool, str]:
    """A vision run trained on its images: the spec took the vision path (its processor and collator) and the data
    report counts rows with images, every step's loss finite (a batch whose images failed to reach the model, or an
    mm_token_type_ids the model refused, fails before or here)."""
    import math

    vision = ((resolved.get("spec") or {}).get("model") or {}).get("vision")
    images = ((summary.get("data") or {}).get("images") or {}).get("train") or {}
    rows, tokens = images.get("image_sequences") or 0, images.get("image_tokens") or 0
    losses = summary.get("losses") or []
    finite = bool(losses) and all(math.isfinite(v) for v in losses)
    ok = bool(vision) and rows > 0 and tokens > rows and finite  # more tokens than images: grids M-RoPE places
    return ok, (
        f"vision: spec's vision path {'on' if vision else 'OFF'}, {rows} rows with images ({tokens} image tokens) "
        f"in the training data, {len(losses)} losses{' all finite' if finite else ' NOT all finite'}: {_verdict(ok)}"
    )
