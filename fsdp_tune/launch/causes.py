"""A failure's evidence read into a few lines for the failure report: the frames that matter of a Python
traceback (the whole traceback stays in the rank's log), and the causes that leave no Python exception behind
or hide behind one: a full disk, an output folder deleted under the run, a port already taken, torchrun's own
exception. No torch: the launcher reads text and the file system."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_DIRECT = "The above exception was the direct cause of the following exception:"
_CHAIN = re.compile(
    r"^(The above exception was the direct cause of the following exception:|"
    r"During handling of the above exception, another exception occurred:)\s*$",
    re.M,
)
# frames that are the machinery around every rank's error, never its cause
_PLUMBING = ("torch/distributed/elastic/", "fsdp_tune/worker/__main__.py", "<frozen runpy>")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")  # `module.Type: message` (the line after the last frame)
_ADDRESS_IN_USE = re.compile(r"port: (\d+).*EADDRINUSE|EADDRINUSE.*port: (\d+)")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?", re.M)
_NO_SPACE = re.compile(r"No space left on device|Errno 28\b|ENOSPC")
FULL_BELOW = 16 * 2**20  # free bytes under which a disk that failed a write counts as full


def root_section(traceback_text: str) -> str:
    """The traceback of the exception that started it: in a chain, an exception raised `from` another is
    the consequence (its cause is printed above it); one raised while handling another is the news."""
    parts = _CHAIN.split(traceback_text)
    sections, separators = parts[0::2], parts[1::2]
    i = len(sections) - 1
    while i > 0 and separators[i - 1].strip() == _DIRECT:
        i -= 1
    return sections[i]


def frames(traceback_text: str, keep: int = 3) -> list[str]:
    """The last `keep` frames of the root exception, one line each: `path:line in function: code`, without
    the launcher's and torchrun's own frames, paths shortened to the package they are in."""
    lines = root_section(traceback_text).splitlines()
    found = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if not m or any(p in m["file"] for p in _PLUMBING):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
        code = "" if set(code) <= set("^~ ") else code
        found.append(f"{_short(m['file'])}:{m['line']} in {m['func']}" + (f": {code}" if code else ""))
    return [f[:160] for f in found[-keep:]]


def _short(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    if "/fsdp_tune/" in path:
        return "fsdp_tune/" + path.rsplit("/fsdp_tune/", 1)[1]
    return path


def last_exception(text: str) -> str | None:
    """The `Type: message` line that ends the last traceback in `text` (a rank's log, torchrun's stderr)."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    lines = root_section(text[start:]).splitlines()
    last_frame = max((i for i, line in enumerate(lines) if _FRAME.match(line)), default=0)
    for line in lines[last_frame + 1 :]:
        if line and not line[0].isspace() and _EXCEPTION.match(line):
            return line.strip()[:300]
    return None


def last_traceback(path: Path, limit: int = 256 * 1024) -> str:
    """The end of a log from its last traceback on ("" when it has none or cannot be read)."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, 2) - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    text = _RANK_PREFIX.sub("", text)  # torch's excepthook prefixes a rank's traceback lines with `[rankN]: `
    start = text.rfind("Traceback (most recent call last):")
    return text[start:] if start >= 0 else ""


def environment(output_dir: str, evidence: str, no_exception: bool = False) -> str | None:
    """A cause outside the code, or None: the output folder deleted under the run, or the disk it is on full
    (ENOSPC in the evidence; or a disk with almost nothing free, whatever the exception: a write the disk cut short
    surfaces later as another error, such as a JSONDecodeError reading that file back)."""
    out = Path(output_dir)
    if not out.is_dir():
        return f"the output folder {out} was deleted while the run was running; the ranks could not write to it"
    try:
        free = shutil.disk_usage(out).free
    except OSError:
        return None
    if _NO_SPACE.search(evidence) or (no_exception and free < FULL_BELOW):
        return f"the disk holding {out} is full ({free / 2**20:.0f} MiB free): a write failed (No space left on device)"
    if free < FULL_BELOW:  # another exception on a full disk: a file a write cut short, read back (a JSONDecodeError)
        cut = "a file written there was most likely cut short"
        return f"the disk holding {out} is full ({free / 2**20:.0f} MiB free): {cut}"
    return None


def port_in_use(torchrun_text: str) -> str | None:
    """The port torchrun could not listen on (EADDRINUSE), or None."""
    m = _ADDRESS_IN_USE.search(torchrun_text)
    return (m.group(1) or m.group(2)) if m else None
