"""Run a LaunchPlan through torchrun, and turn its outcome into a summary or one clear failure report."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import ExitCode, LaunchError
from fsdp_tune.files import write_atomic
from fsdp_tune.plan import LaunchPlan
from fsdp_tune.worker_paths import STOP_FILE, SUMMARY_NAME

# torchrun's default wait for every node to join (static and c10d rendezvous alike)
RENDEZVOUS_TIMEOUT_S = 600


def prepare(cfg: RunConfig, plan: LaunchPlan) -> RunConfig:
    """Materialize builtin models and write the resolved config that every rank reads."""
    name = cfg.model.model_name_or_path or ""
    if name.startswith("builtin:"):
        from fsdp_tune.builtin_models import materialize

        cfg = replace(cfg, model=replace(cfg.model, model_name_or_path=str(materialize(name.removeprefix("builtin:")))))
    out = Path(plan.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plan.node_rank == 0:
        # a summary is this run's or none; an overwritten run's metrics are kept aside, a resumed run appends.
        # Node 0 only: on a shared filesystem the other nodes see the same folder.
        (out / SUMMARY_NAME).unlink(missing_ok=True)
        if not plan.resume_from_checkpoint and (out / "metrics.jsonl").exists():
            (out / "metrics.jsonl").replace(out / "metrics.previous.jsonl")
    write_atomic(plan.resolved_path, json.dumps({"config": cfg.as_dict(), "plan": plan.as_dict()}, indent=2))
    return cfg


def _die_with_parent() -> None:
    """In the torchrun child: get SIGTERM if the launcher dies (even by SIGKILL), so no ranks are orphaned
    by the new session. Linux only; elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Outcome:
    returncode: int
    signal: int | None  # the first SIGINT/SIGTERM the launcher received, if any
    torchrun_tail: str  # the end of torchrun's stderr, for the failure report


def run(plan: LaunchPlan) -> Outcome:
    """Start torchrun and wait.

    torchrun runs in its own session so a terminal's Ctrl-C reaches only us. The first SIGINT/SIGTERM
    writes the stop file: every rank finishes its step, saves a checkpoint and exits. A second one
    terminates torchrun (and with it the ranks) at once. torchrun's stderr passes through to ours, and
    its tail is kept for the failure report.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **plan.env)
    stop_file = Path(plan.output_dir, STOP_FILE)
    stop_file.unlink(missing_ok=True)
    if plan.nnodes > 1:
        # otherwise a machine whose launch failed looks, from the others, like a silent hang
        print(
            f"waiting for all {plan.nnodes} machines to join at {plan.master_addr}:{plan.master_port} "
            f"(torchrun gives up after {RENDEZVOUS_TIMEOUT_S} s if one never starts)",
            file=sys.stderr,
            flush=True,
        )
    proc = subprocess.Popen(
        plan.command(), env=env, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent
    )
    tail = bytearray()

    def pump() -> None:
        assert proc.stderr is not None
        out = sys.stderr.buffer
        while chunk := os.read(proc.stderr.fileno(), 65536):
            out.write(chunk)
            out.flush()
            tail.extend(chunk)
            del tail[:-65536]

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)
        if len(received) == 1:
            sys.stderr.write(
                f"\nfsdp-tune: {signal.Signals(signum).name}: finishing the current step and saving a "
                "checkpoint; signal again to stop at once\n"
            )
            stop_file.write_text(str(signum))
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        reader.join(timeout=5)
        stop_file.unlink(missing_ok=True)
    return Outcome(code, received[0] if received else None, tail.decode("utf-8", "replace"))


_FIELDS = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*?)\s*$", re.M)
# what a rank raises when another rank died under it: the consequence, not the cause
_LOST_PEER = re.compile(
    r"connection reset by peer|connection closed by peer|broken pipe|connection refused|remote process exited|"
    r"ncclRemoteError|communicator was aborted",
    re.I,
)


def _root_cause(torchrun_stderr: str) -> dict[str, str] | None:
    """The fields of torchrun's "Root Cause (first observed failure)" block."""
    _, found, block = torchrun_stderr.rpartition("Root Cause (first observed failure)")
    if not found:
        return None
    fields = dict(_FIELDS.findall(block))
    return fields if "rank" in fields and "exitcode" in fields else None


def _other_failures(torchrun_stderr: str) -> list[dict[str, str]]:
    """The fields of each block under torchrun's "Failures:" (every failed rank but the first observed)."""
    section = torchrun_stderr.rpartition("Failures:")[2].partition("Root Cause")[0]
    blocks = re.split(r"^\s*\[\d+\]:\s*$", section, flags=re.M)[1:]
    return [f for f in (dict(_FIELDS.findall(b)) for b in blocks) if "rank" in f and "exitcode" in f]


def _describe(failure: dict[str, str]) -> tuple[str, int, str]:
    """(rank, exit code, cause) of one failed rank."""
    code = int(failure["exitcode"].split()[0])
    cause = _cause_from_error_file(failure.get("error_file", ""))
    if cause is None:
        cause = (
            f"killed by {signal.Signals(-code).name}" + (" (out of host memory? see dmesg)" if code == -9 else "")
            if code < 0
            else f"exited with code {code} without a Python exception"
        )
    return failure["rank"].split()[0], code, cause


def failure_report(plan: LaunchPlan, outcome: Outcome) -> LaunchError:
    """One block: which rank and host failed, the root cause, where the full log is, the exit code.

    torchrun's "first observed failure" can be a rank that only lost its peer (it raised "connection reset
    by peer" before torchrun noticed the peer die): then the rank that died on its own is the root cause."""
    if outcome.signal is not None:
        code = ExitCode.INTERRUPTED if outcome.signal == signal.SIGINT else ExitCode.TERMINATED
        return LaunchError(f"stopped by {signal.Signals(outcome.signal).name}", code)
    root = _root_cause(outcome.torchrun_tail)
    log_dir = Path(plan.output_dir, "logs")
    if not root:
        return LaunchError(f"training failed (torchrun exit code {outcome.returncode}); rank logs: {log_dir}")
    rank, code, cause = _describe(root)
    host = root.get("host", "?")
    consequence = ""
    if _LOST_PEER.search(cause):
        for other in _other_failures(outcome.torchrun_tail):
            o_rank, o_code, o_cause = _describe(other)
            died_alone = o_code != -signal.SIGTERM and not _LOST_PEER.search(o_cause)  # torchrun SIGTERMs the rest
            if o_rank != rank and died_alone:
                consequence = f"\n  then:       rank {rank} lost its peer ({cause})"
                rank, code, cause, host = o_rank, o_code, o_cause, other.get("host", "?")
                break
    return LaunchError(
        f"training failed on rank {rank} (host {host}, exit code {code})\n"
        f"  root cause: {cause}\n"
        f"  full log:   {log_dir / f'rank-{rank}.log'}"
        + consequence
        + _silent_peers(outcome.torchrun_tail, rank, cause)
    )


def _silent_peers(torchrun_stderr: str, root_rank: str, cause: str) -> str:
    """When the root cause is a collective timeout, the rank to look at is one that never answered: it
    raised nothing itself and torchrun had to terminate it."""
    if "timed out" not in cause.lower() and "timeout" not in cause.lower():
        return ""
    killed = []
    for failure in _other_failures(torchrun_stderr):
        rank, code = failure["rank"].split()[0], int(failure["exitcode"].split()[0])
        if rank != root_rank and code < 0:
            killed.append(rank)
    if not killed:
        return ""
    return (
        f"\n  waiting on: rank{'s' if len(killed) > 1 else ''} {', '.join(killed)}, which raised no error and "
        "had to be terminated: hung or stuck (its log shows where)"
    )


def _cause_from_error_file(path: str) -> str | None:
    """`ExceptionType: message` from the error file torchrun's @record writes for a failed rank."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    message = data.get("message", {})
    text = message.get("message", "") if isinstance(message, dict) else str(message)
    return text.strip().splitlines()[-1] if text.strip() else None


def read_summary(plan: LaunchPlan) -> dict | None:
    path = Path(plan.output_dir, SUMMARY_NAME)
    return json.loads(path.read_text()) if path.exists() else None
