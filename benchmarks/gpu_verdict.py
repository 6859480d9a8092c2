"""The GPU check's verdict, read from its output folder (probe.json, scenarios.jsonl, summary.json), so a reader
of the results needs one command: what passed, what failed and why, the figures, and each scenario's estimate
beside what it took (the budget's scaling, checked). Works on a run cut off: whatever lines are there.

  python -m benchmarks.gpu_verdict OUT
No torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(folder: Path) -> tuple[dict, list[dict], dict]:
    def read(name: str) -> dict:
        path = folder / name
        return json.loads(path.read_text()) if path.exists() else {}

    path = folder / "scenarios.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return read("probe.json"), rows, read("summary.json")


def _cell(value, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def table(folder: Path) -> list[str]:
    probe, rows, summary = _load(folder)
    machine = summary.get("machine", {})
    out = [f"GPU check verdict ({folder}): {machine.get('gpu', '?')} x {machine.get('gpus', '?')}"]
    if probe:
        stages = ", ".join(f"{r['stage']} {'ok' if r['ok'] else 'FAILED'}" for r in probe.get("device_stages", []))
        out.append(
            f"probe: {'ok' if probe.get('ok') else 'FAILED'} in {probe.get('seconds')} s; device: {stages or '-'}"
        )
        for r in probe.get("device_stages", []):
            out.append(f"  {r['stage']:<8} {r['detail']}")
        out += [
            f"  FAILED {x}"
            for k in ("decision_failures", "fsdp_tune_modules", "library_imports", "library_members")
            for x in probe.get(k, [])
        ]
    else:
        out.append("probe: no probe.json (cut off before the probe ended)")
    head = f"{'scenario':<60} {'status':<7} {'took':>5} {'est':>5} {'tok/s':>8} {'MFU4N':>6} {'peak':>6} {'plan':>6}"
    out += ["", head + "  (s; GiB)"]
    for r in rows:
        peak = r.get("peak_allocated_gib") or r.get("peak_rss_gib")
        plan = r.get("planned_allocated_gib") or r.get("planned_host_per_rank_gib")
        cells = [
            _cell(r.get("seconds"), ".0f"),
            _cell(r.get("estimate_s"), ".0f"),
            _cell(r.get("tokens_per_s"), ",.0f"),
            _cell(r.get("mfu"), ".1%"),
            _cell(peak, ".2f"),
            _cell(plan, ".2f"),
        ]
        out.append(
            f"{r['name'][:60]:<60} {r['status']:<7} "
            + " ".join(f"{c:>{w}}" for c, w in zip(cells, (5, 5, 8, 6, 6, 6), strict=True))
        )
    failed = [(r["name"], c) for r in rows for c, ok in (r.get("checks") or {}).items() if not ok]
    out += ["", f"failed checks ({len(failed)}):" if failed else "failed checks: none"]
    out += [f"  {name}: {check}" for name, check in failed]
    for r in rows:
        if r.get("kind") == "throughput" and r.get("status") != "skipped":
            out += ["", f"throughput ({r['name']}):", f"  MFU {r.get('mfu_formula', '-')}"]
            out += [
                f"  {x}" for x in r.get("lines", []) if x.startswith(("steady", "NeMo", "fsdp-tune here", "  same"))
            ]
            out += [f"  goal {'met' if met else 'NOT met'}: {g}" for g, met in (r.get("goals") or {}).items()]
    skipped = [r for r in rows if r["status"] == "skipped"]
    out += ["", f"skipped ({len(skipped)}): " + "; ".join(f"{r['name']} ({r.get('why')})" for r in skipped)]
    count = {k: sum(r["status"] == k for r in rows) for k in ("pass", "fail", "skipped")}
    cut = "" if summary.get("finished") else " (cut off: not every scenario recorded)"
    out.append(
        f"verdict: {'PASS' if probe.get('ok') and rows and not count['fail'] else 'FAIL'}: {count['pass']} passed, "
        f"{count['fail']} failed, {count['skipped']} skipped in {summary.get('elapsed_s', '?')} s of "
        f"{summary.get('budget_s', '?')}{cut}"
    )
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__)
        return 2
    lines = table(Path(argv[0]))
    print("\n".join(lines))
    return 0 if lines[-1].startswith("verdict: PASS") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
