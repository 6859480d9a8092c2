"""Alternating, repeated wall-clock measurement of commands (medians), for noisy shared machines."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Sequence


def wall(cmd: Sequence[str], env: dict | None = None, timeout: float = 600) -> float:
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return elapsed


def alternate(commands: dict[str, Sequence[str]], repeats: int, env: dict | None = None) -> dict[str, list[float]]:
    """Run the commands round-robin `repeats` times (one warm-up round first, discarded)."""
    for cmd in commands.values():
        wall(cmd, env)
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            times[name].append(wall(cmd, env))
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def offline_env(**extra: str) -> dict[str, str]:
    """The environment every benchmarked command runs in: offline, no tokenizer thread pools."""
    import os

    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)
