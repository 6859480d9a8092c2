"""Rank 0's console during training: the sharding and first-step phase lines, one progress line (step/total,
loss, learning rate, tokens/s, ETA, peak memory) and evaluation results.

On a terminal the progress line is redrawn in place at most every REDRAW_S; elsewhere (a file, SLURM's
output) it is a plain line at logging steps, at most one every LINES_EVERY_S, and the last step's. The log
gets a line at every logging step. Trainer's own progress bar and log dicts go to the log only (worker/logs.py).
"""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback

from fsdp_tune.config.methods import Metric
from fsdp_tune.worker import phases
from fsdp_tune.worker.loading.report import peak_rss_mib
from fsdp_tune.worker.logs import console
from fsdp_tune.worker.rank import is_main
from fsdp_tune.worker.wrappers import describe_units

REDRAW_S = 0.5
LINES_EVERY_S = 10.0


class ProgressCallback(TrainerCallback):
    """`timings`: the recipe's Phases (when the rank and the train step started); `metrics`: the method's
    evaluation metrics (training/methods.py)."""

    def __init__(
        self,
        device: str,
        world_size: int,
        timings: phases.Phases,
        live: bool,
        metrics: tuple[Metric, ...],
        shown: tuple[Metric, ...] = (),
    ):
        self.device, self.world_size, self.timings, self.live = device, world_size, timings, live
        self.metrics, self.shown = metrics, shown  # evaluation's, the progress line's (a method's own)
        self.values: dict[str, float] = {}
        self.started = timings.started.get("rank")
        self.began = self.drawn = 0.0
        self.first_at: float | None = None
        self.printed: float | None = None
        self.first_step = self.step = self.total = self.printed_step = 0
        self.loss: float | None = None
        self.lr: float | None = None
        self.tokens_per_s: float | None = None
        self._tokens_seen: tuple[float, float] | None = None  # (time, tokens) at the previous log

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not is_main():
            return
        self.began = time.time()
        self.step, self.total = state.global_step, state.max_steps
        units = sum(describe_units(model).values()) if model is not None else 0
        detail = f"{units} FSDP units on {self.world_size} rank{'s' if self.world_size > 1 else ''}"
        if state.global_step:
            detail += f", resumed at step {state.global_step}"
        since = self.timings.started.get("train")
        phases.line("sharding", self.began - since if since else None, detail)

    def on_step_end(self, args, state, control, **kwargs):
        if not is_main():
            return
        now = time.time()
        self.step, self.total = state.global_step, state.max_steps
        if self.first_at is None:
            self.first_at, self.first_step = now, state.global_step
            since = f"{now - self.started:.1f} s after the rank started" if self.started else ""
            phases.line("first step", now - self.began, since)
        if self.live and (now - self.drawn >= REDRAW_S or self.step >= self.total):
            self.drawn = now
            console().status(self.text(now))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not is_main() or not logs or "loss" not in logs:
            return
        now = time.time()
        self.loss, self.lr = _float(logs.get("loss")), _float(logs.get("learning_rate"))
        self.values.update({m.key: v for m in self.shown if (v := _float(logs.get(m.key))) is not None})
        tokens = _float(logs.get("num_tokens"))
        if tokens is not None:
            then, before = self._tokens_seen or (self.began, 0.0)
            if tokens > before and now > then:
                self.tokens_per_s = (tokens - before) / (now - then)
            self._tokens_seen = (now, tokens)
        text = self.text(now)
        out = console()
        if out.log is not None:
            out.log.write(f"fsdp-tune: {text}\n")
        if self.live:
            out.status(text)
        elif self.printed is None or now - self.printed >= LINES_EVERY_S or state.global_step >= state.max_steps:
            self._print(text, now, state.global_step)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not is_main() or not metrics:
            return
        shown = [f"{m.label} {metrics[m.key]:{m.fmt}}" for m in self.metrics if m.key in metrics]
        phases.line(f"eval (step {state.global_step})", _float(metrics.get("eval_runtime")), ", ".join(shown))

    def on_train_end(self, args, state, control, **kwargs):
        if not is_main():
            return
        now = time.time()
        if self.live:
            console().status(self.text(now))
            console().end_status()
        elif self.printed_step != state.global_step:
            self._print(self.text(now), now, state.global_step)

    def _print(self, text: str, now: float, step: int) -> None:
        console().line(text)
        self.printed, self.printed_step = now, step

    def text(self, now: float) -> str:
        parts = [f"step {self.step}/{self.total}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.3f}")
        parts += [f"{m.label} {self.values[m.key]:{m.fmt}}" for m in self.shown if m.key in self.values]
        if self.lr is not None:
            parts.append(f"lr {self.lr:.1e}")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tokens/s")
        done = self.step - self.first_step
        if done > 0 and self.first_at is not None and self.step < self.total:
            parts.append(f"ETA {_clock((self.total - self.step) * (now - self.first_at) / done)}")
        parts.append(f"peak {self.peak_memory()}")
        return "  ".join(parts)

    def peak_memory(self) -> str:
        if self.device == "cuda":
            return f"{torch.cuda.max_memory_reserved() / 2**30:.1f} GiB GPU reserved"
        return f"{peak_rss_mib():,.0f} MiB RSS"


def _float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _clock(seconds: float) -> str:
    s = int(seconds + 0.5)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
