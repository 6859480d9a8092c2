"""The GPU check's processes: a command in a process group of its own with a cap, fsdp-tune's CLI and plan, what
a failed run left, and nvidia-smi read from outside the ranks (benchmarks/gpu_check.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIMULATED_GPU = "NVIDIA H200, 580.159.03, 143771"  # nvidia-smi's name, driver, MiB for --cpu-smoke


def run_group(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`cmd` in its own process group, ended with everything it started (TERM, then KILL) at `timeout`: exit 124."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=max(timeout, 1))
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        out, err = end_group(proc)
        return subprocess.CompletedProcess(cmd, 124, out, f"{err}\ncut at the scenario's cap ({timeout:.0f} s)")


def end_group(proc: subprocess.Popen) -> tuple[str, str]:
    """TERM the process group (fsdp-tune stops its ranks on TERM), then KILL what is left: (stdout, stderr)."""
    out = err = ""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            out, err = proc.communicate(timeout=15)
            break
        except subprocess.TimeoutExpired:
            continue
        except ValueError:  # the pipes were read elsewhere (a streaming reader): wait only
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
                break
    return out or "", err or ""


def cli(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """`python -m fsdp_tune ARGS` within `timeout` (run_group)."""
    return run_group([sys.executable, "-m", "fsdp_tune", *args], env, timeout)


def plan(args: list[str], gpu_name: str, gpu_mib: int | None, on_cpu: bool, env: dict, timeout: float) -> dict:
    """`fsdp-tune plan --json` for the same flags, on this machine's GPU (its name and memory) or its CPU."""
    from fsdp_tune.preflight.memory import gpu_key

    where = (
        ["--cpu"] if on_cpu else ["--gpu", gpu_key(gpu_name)] + (["--gpu_memory", f"{gpu_mib}MiB"] if gpu_mib else [])
    )
    done = cli(["plan", *args, "--json", *where], env, timeout)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-600:]}


def failure_text(proc: subprocess.CompletedProcess, out: Path) -> str:
    """The launcher's last words and each rank log's tail (for failures.log)."""
    parts = [f"exit {proc.returncode}", proc.stderr[-3000:], proc.stdout[-1500:]]
    for log in sorted((out / "logs").glob("rank-*.log")) if (out / "logs").is_dir() else []:
        parts.append(f"--- {log.name} (last 40 lines)\n" + "\n".join(log.read_text().splitlines()[-40:]))
    return "\n".join(parts)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def stand_in_nvidia_smi(folder: Path, used_mib: int = 0) -> Path:
    """A stand-in nvidia-smi for --cpu-smoke: an H200 (name, driver, memory) with `used_mib` in use and no compute
    process. Returns the folder to put first on the PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f"  *memory.used*) echo {used_mib} ;;\n"
        "  *compute-apps*) ;;\n"
        f"  *) echo '{SIMULATED_GPU}' ;;\n"
        "esac\n"
    )
    script.chmod(0o755)
    return folder


class GpuWatch:
    """nvidia-smi sampled from outside the ranks while a command runs: the GPU's memory in use and the processes
    holding a CUDA context. A run that must not touch the GPU is judged on what this saw, not on what its ranks
    report (a rank that never asks CUDA reports no GPU memory whether or not another process of the run used it)."""

    def __init__(self, env: dict, every_s: float = 0.5):
        self.env, self.every_s = env, every_s
        self.samples: list[dict] = []
        self.baseline = self.sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> dict:
        used = self._query(["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
        apps = self._query(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        mib = [float(x) for x in used if x.replace(".", "", 1).isdigit()]
        return {"t": time.time(), "used_mib": sum(mib) if mib else None, "apps": sorted(apps)}

    def _query(self, args: list[str]) -> list[str]:
        try:
            done = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, env=self.env, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(self.sample())

    def __enter__(self) -> GpuWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.samples.append(self.sample())
