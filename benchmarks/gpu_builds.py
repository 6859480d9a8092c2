"""The builtin models the GPU check trains, built in the background while the probe's last steps and the first
scenarios run (the 8B one is 15 GiB written), one after the other, each timed; a scenario waits for its own."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from benchmarks.gpu_proc import run_group

BUILD_CAP_S = {"cuda": 300.0, "cpu": 900.0}


class Builds:
    def __init__(self, models: list[str], log: Callable[[str], None], cuda: bool):
        import os

        self.log, self.env = log, dict(os.environ)
        self.cap = BUILD_CAP_S["cuda" if cuda else "cpu"]
        self.done: dict[str, dict] = {}
        self.events = {m: threading.Event() for m in models if m.startswith("builtin:")}
        self.thread = threading.Thread(target=self._build_all, daemon=True)
        self.thread.start()

    def _build_all(self) -> None:
        from fsdp_tune.sources.builtin import target

        for model, event in self.events.items():
            folder = target(model.removeprefix("builtin:"))
            if folder.is_dir():
                self.done[model] = {"ok": True, "cached": True, "seconds": 0.0}
                event.set()
                continue
            started = time.time()
            folder.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "fsdp_tune.models.tiny", model.removeprefix("builtin:"), str(folder)]
            proc = run_group(cmd, self.env, self.cap)
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**30 if folder.is_dir() else 0
            self.done[model] = {
                "ok": proc.returncode == 0,
                "seconds": round(time.time() - started, 1),
                "gib": round(size, 2),
                **({} if proc.returncode == 0 else {"error": proc.stderr[-1500:]}),
            }
            self.log(f"built {model} in the background: {self.said(model)}")
            event.set()

    def wait(self, model: str, timeout: float) -> bool:
        """Whether `model` is there (a model that is not a builtin is the user's: there)."""
        event = self.events.get(model)
        if event is None:
            return True
        event.wait(max(timeout, 1.0))
        return bool(self.done.get(model, {}).get("ok"))

    def wait_all(self, timeout: float) -> None:
        self.thread.join(max(timeout, 0.1))

    def said(self, model: str) -> str:
        d = self.done.get(model)
        if d is None:
            return f"{model}: not built yet"
        if d.get("cached"):
            return f"{model}: built before (cached)"
        verdict = "ok" if d["ok"] else f"FAILED: {d.get('error', '')[-300:]}"
        return f"{model}: {d['gib']:.2f} GiB in {d['seconds']:.1f} s, {verdict}"

    def record(self) -> dict:
        return {m: {k: v for k, v in d.items() if k != "error"} for m, d in self.done.items()}
