"""One run at a time per output folder: the run id, and the lock that says which run owns the folder.

The lock is `flock` on OUTPUT_DIR/fsdp_tune.lock, held by the launcher and passed to torchrun, so it dies
with the run (even by SIGKILL) and never needs cleaning up. The file records the holder (run id, host,
pid, start, command) for the refusal message. Where the file system has no flock (some network mounts),
the record alone decides: a holder on this host whose pid is gone is stale and taken over; a holder on
another host is taken at its word. Machines other than 0 of a multi-node run share node 0's folder and
lock nothing.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.errors import Finding, PreflightError, Severity
from fsdp_tune.redact import redact_argv
from fsdp_tune.runfiles import LOCK_NAME, open_nofollow


def new_run_id() -> str:
    """Sortable by start time, unique across machines: 20250131-142501-3fa9c2."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass
class OutputLock:
    path: Path
    fd: int
    note: str = ""  # what acquiring it found (a stale holder taken over), for the console

    def release(self) -> None:
        """Clear the record and drop the lock (the file stays: deleting a lock file races its next user)."""
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1


def acquire(output_dir: str | Path, run_id: str) -> OutputLock:
    """Own `output_dir` for this run, or raise PreflightError (PF034) naming the run that owns it."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    fd = open_nofollow(out, LOCK_NAME, os.O_RDWR)  # a planted link is refused, never truncated through
    holder = _read(fd)
    try:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked = True
    except BlockingIOError:
        os.close(fd)
        raise PreflightError([_in_use(out, holder, "it holds the lock")]) from None
    except (OSError, ImportError) as err:
        if isinstance(err, OSError) and err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        locked = False  # no flock here: the record decides
    note = ""
    if holder:
        alive = _alive(holder)
        if not locked and alive is not False:
            os.close(fd)
            raise PreflightError([_in_use(out, holder, "its record says so and this file system has no locks")])
        note = f"note: {out} was last owned by run {holder.get('run_id')} ({_who(holder)}), which is no longer running"
    _write(fd, run_id)
    return OutputLock(path, fd, note)


def holder_of(output_dir: str | Path) -> dict | None:
    """The live holder of the folder's lock, or None (for the pre-flight; acquire() is the real test)."""
    path = Path(output_dir) / LOCK_NAME
    if not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        holder = _read(fd)
        if not holder:
            return None
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder
        except OSError:
            return holder if _alive(holder) is not False else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def in_use_finding(output_dir: str | Path, holder: dict) -> Finding:
    return _in_use(Path(output_dir), holder, "it holds the lock")


def _in_use(out: Path, holder: dict | None, how: str) -> Finding:
    holder = holder or {}
    return Finding(
        "PF034",
        Severity.ERROR,
        "--output_dir",
        "command line",
        f"{out} is in use by run {holder.get('run_id', '?')} ({_who(holder)}, started {holder.get('started', '?')}; "
        f"{how}): two runs in one folder would train each other's config and overwrite each other's checkpoints",
        "wait for it to finish, stop it, or choose another --output_dir"
        + (f" (if no run uses it, delete {out / LOCK_NAME})" if "record" in how else ""),
    )


def _who(holder: dict) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"


def _alive(holder: dict) -> bool | None:
    """Whether the holder's process runs: True, False, or None when it is on another host (cannot tell)."""
    if holder.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(holder.get("pid", 0)), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


def _read(fd: int) -> dict | None:
    try:
        text = os.pread(fd, 65536, 0).decode("utf-8", "replace")
        data = json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write(fd: int, run_id: str) -> None:
    record = {
        "run_id": run_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(redact_argv(sys.argv)),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
