"""torchrun's outcome -> one failure report: which rank and host failed, the root cause, the frames that matter,
where the logs are (launch/causes.py reads the evidence).

torchrun prints a "Root Cause (first observed failure)" block and a "Failures:" list; each names a rank, its
exit code and the error file torchrun's @record wrote. The first observed failure can be a rank that only
lost its peer, and a collective timeout names the rank that waited, not the one that hung: both are
untangled here.
"""

from __future__ import annotations

import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.errors import ExitCode, LaunchError
from fsdp_tune.launch import causes
from fsdp_tune.runfiles import LOG_DIR, rank_log, torchrun_log


@dataclass
class Outcome:
    returncode: int
    signal: int | None  # the first SIGINT/SIGTERM the launcher received, if any
    torchrun_tail: str  # the end of torchrun's stderr, for the failure report


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


def _describe(failure: dict[str, str]) -> tuple[str, int, str | None, str]:
    """(rank, exit code, cause, the rank's traceback) of one failed rank; cause None: no Python exception was
    recorded for a rank that exited on its own (its log or the machine may still say why)."""
    code = int(failure["exitcode"].split()[0])
    cause, callstack = _cause_from_error_file(failure.get("error_file", ""))
    if cause is None and code < 0:
        cause = f"killed by {signal.Signals(-code).name}" + (" (out of host memory? see dmesg)" if code == -9 else "")
    return failure["rank"].split()[0], code, cause, callstack


def failure_report(output_dir: str, outcome: Outcome) -> LaunchError:
    """One short block: which rank and host failed, the root cause, the frames that matter, where the full logs
    are. Whole tracebacks (the rank's, torchrun's) stay in the logs, named.

    torchrun's "first observed failure" can be a rank that only lost its peer (it raised "connection reset
    by peer" before torchrun noticed the peer die): then the rank that died on its own is the root cause."""
    if outcome.signal is not None:
        return stopped(outcome.signal, f"; {resume_line(output_dir, after='')}")
    root = _root_cause(outcome.torchrun_tail)
    if not root:
        return _torchrun_failed(output_dir, outcome)
    rank, code, cause, callstack = _describe(root)
    host = root.get("host", "?")
    consequence = ""
    if _LOST_PEER.search(cause or ""):
        for other in _other_failures(outcome.torchrun_tail):
            o_rank, o_code, o_cause, o_stack = _describe(other)
            died_alone = o_code != -signal.SIGTERM and not _LOST_PEER.search(o_cause or "")  # torchrun SIGTERMs
            if o_rank != rank and died_alone:
                consequence = f"\n  then:       rank {rank} lost its peer ({cause})"
                rank, code, cause, callstack, host = o_rank, o_code, o_cause, o_stack, other.get("host", "?")
                break
    cause, callstack = _explained(output_dir, rank, code, cause, callstack, outcome.torchrun_tail)
    where = causes.frames(callstack)
    lines = [f"training failed on rank {rank} (host {host}, exit code {code})", f"  root cause: {cause}"]
    lines += [f"  {'where:' if i == 0 else '':<11} {frame}" for i, frame in enumerate(where)]
    lines.append(f"  full log:   {rank_log(output_dir, rank)}" + (" (the whole traceback)" if where else ""))
    lines.append(f"  torchrun:   {torchrun_log(output_dir)}")
    lines.append(f"  resume:     {resume_line(output_dir)}")
    return LaunchError("\n".join(lines) + consequence + _silent_peers(outcome.torchrun_tail, rank, cause))


def resume_line(output_dir: str, after: str = "once the cause is fixed, ") -> str:
    """What a resume continues from: the newest complete checkpoint of this run, or none."""
    from fsdp_tune.rundir.checkpoints import latest_complete

    newest, _ = latest_complete(output_dir)
    if newest is None:
        return "no complete checkpoint was written: a new launch starts from step 0"
    return f"{after}--resume_from_checkpoint latest continues from {newest.path} (step {newest.step})"


def stopped(signum: int, said: str = "") -> LaunchError:
    """A run stopped on request: exit 130 for SIGINT (Ctrl-C), 143 for the others; printed as an interruption, not
    as an error (cli/common.py reads the exit code)."""
    code = ExitCode.INTERRUPTED if signum == signal.SIGINT else ExitCode.TERMINATED
    name = signal.Signals(signum).name + (" (Ctrl-C)" if signum == signal.SIGINT else "")
    return LaunchError(f"stopped by {name}{said}", code)


def _explained(output_dir: str, rank: str, code: int, cause: str | None, callstack: str, tail: str) -> tuple[str, str]:
    """The cause in one line, and the traceback its frames come from. A rank that left no error file (a full
    disk cannot take one) is read from its own log; a cause outside the code (the output folder deleted, the
    disk full) comes first."""
    if cause is None and code > 0:
        callstack = causes.last_traceback(rank_log(output_dir, rank))
        cause = causes.last_exception(callstack)
    evidence = "\n".join((cause or "", callstack, tail[-4096:]))
    outside = causes.environment(output_dir, evidence, no_exception=cause is None and code > 0)
    if outside:
        return outside + (f" ({cause})" if cause else ""), callstack
    return cause or f"exited with code {code} without a Python exception", callstack


def _torchrun_failed(output_dir: str, outcome: Outcome) -> LaunchError:
    """torchrun itself failed before or between the ranks (a rendezvous it could not hold, a port in use): its
    own exception, one line, and its log."""
    tail = outcome.torchrun_tail
    port = causes.port_in_use(tail)
    logs = f"\n  torchrun:   {torchrun_log(output_dir)}\n  rank logs:  {Path(output_dir, LOG_DIR)}"
    if port:
        err = LaunchError(
            f"training failed to start: port {port} is in use on this machine (EADDRINUSE): torchrun could not "
            f"listen there" + logs
        )
        err.hint = f"--main_process_port {int(port) + 1} (any free port, the same on every machine)"
        return err
    cause = causes.environment(output_dir, tail[-4096:]) or causes.last_exception(tail)
    if cause:
        return LaunchError(f"training failed (torchrun exit code {outcome.returncode})\n  root cause: {cause}" + logs)
    return LaunchError(f"training failed (torchrun exit code {outcome.returncode})" + logs)


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


def _cause_from_error_file(path: str) -> tuple[str | None, str]:
    """(`ExceptionType: message`, the traceback) from the error file torchrun's @record writes for a failed rank."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None, ""
    message = data.get("message", {})
    text = message.get("message", "") if isinstance(message, dict) else str(message)
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    callstack = extra.get("py_callstack", "") if isinstance(extra, dict) else ""
    return _first_line(text), callstack if isinstance(callstack, str) else ""


def _first_line(text: str, more: int = 200) -> str | None:
    """The exception's type and its message's first line, whole (torchrun writes `Type: str(e)`; a file's path
    in it must survive). A message that runs on over lines (a module's repr, a table) adds a little of what
    follows, not its last line (which can be a lone ')')."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    rest = " ".join(lines[1:3])
    if len(rest) > more:
        rest = rest[: more - 4] + " ..."
    elif len(lines) > 3:
        rest += " ..."
    return f"{lines[0]} {rest}".rstrip()
