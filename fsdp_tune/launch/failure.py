"""torchrun's outcome -> one failure report: which rank and host failed, the root cause, where its log is.

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
from fsdp_tune.runfiles import LOG_DIR, rank_log


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


def failure_report(output_dir: str, outcome: Outcome) -> LaunchError:
    """One block: which rank and host failed, the root cause, where the full log is, the exit code.

    torchrun's "first observed failure" can be a rank that only lost its peer (it raised "connection reset
    by peer" before torchrun noticed the peer die): then the rank that died on its own is the root cause."""
    if outcome.signal is not None:
        code = ExitCode.INTERRUPTED if outcome.signal == signal.SIGINT else ExitCode.TERMINATED
        return LaunchError(f"stopped by {signal.Signals(outcome.signal).name}", code)
    root = _root_cause(outcome.torchrun_tail)
    log_dir = Path(output_dir, LOG_DIR)
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
        f"  full log:   {rank_log(output_dir, rank)}" + consequence + _silent_peers(outcome.torchrun_tail, rank, cause)
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
    return _first_line(text)


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
