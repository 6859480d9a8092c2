"""The console door: every text fsdp-tune prints passes through `printable`, in one place per process.

Values reach the console from files and flags people did not write themselves (a dataset row, a file name, a model
folder's name, a chat model's reply): an escape sequence among them would set the window title, clear the screen,
draw a green "ok:" line or plant a link (OSC 8, which a pipe passes on). So the launcher's sys.stdout and sys.stderr
are a `ConsoleStream` (cli/app.py), and a rank's console lines go through `printable` in worker/logs.py: whatever
command prints, whatever value it prints, control characters come out escaped (`\\x1b`, `\\u202e`), never obeyed.

Kept: a newline and a tab (a multi-line message is ours; `format_finding` keeps a finding on one line itself).
Escaped: the other C0 controls (ESC, BEL, CR, backspace, NUL), DEL, the C1 controls U+0080-U+009F (0x9b is a CSI on
its own), bidirectional overrides and isolates (a file name shown backwards), line and paragraph separators, and
lone surrogates (an undecodable byte of a file name, which `surrogateescape` would write back raw).

Escaping is per character, so a text written in pieces (a reply streamed a token at a time) is cleaned the same.
fsdp-tune's own colours (`colour`) are marked with a per-process random tag that no file or flag can know, and the
stream turns the marks into colour codes on a terminal (nothing elsewhere) after the text around them is cleaned.
"""

from __future__ import annotations

import re
import secrets
from typing import TextIO

from fsdp_tune.printable import printable

_TAG = "\ue000" + secrets.token_hex(8)  # a private-use character and 16 random hex digits: this process's own
_MARK = re.compile(re.escape(_TAG) + r"\[([0-9;]*)m")


def colour(text: str, fg: str | None = None, bold: bool = False) -> str:
    """`text` (ours: "error:", a rule id) marked to be shown in colour where the console is a terminal."""
    import click

    styled = click.style(printable(text), fg=fg, bold=bold)  # printable: no ESC of the text's own survives
    return styled.replace("\x1b", _TAG)


def render(text: str, tty: bool) -> str:
    """What reaches the console for `text`: cleaned, fsdp-tune's colour marks made colour codes on a terminal."""
    pieces = _MARK.split(text)  # text, codes, text, codes, ..., text
    out = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            out.append(printable(piece))
        elif tty:
            out.append(f"\x1b[{piece}m")
    return "".join(out)


class ConsoleStream:
    """sys.stdout / sys.stderr of the launcher: every write cleaned (`render`); and when the reader leaves
    (`fsdp-tune rules | head`), the rest of the output goes to /dev/null and the command runs on to its own exit
    code, with no BrokenPipeError (an exit 3 or a traceback about a closed pipe is no answer to a reader that had
    seen enough)."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        try:
            self._tty = stream.isatty()
        except (OSError, ValueError):
            self._tty = False

    def write(self, text: str) -> int:
        try:
            self._stream.write(render(text, self._tty))
        except BrokenPipeError:
            self._drop()
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
