"""How a control character is shown wherever fsdp-tune shows a value it did not write: on the console (the console
door, output/console.py) and in the files it writes for people and schedulers (a job file's comment lines,
schedulers/jobtext.py). One table, so a value reads the same escaped (`\\x1b`, `\\u202e`) in both.

Escaped: the C0 controls (ESC, BEL, CR, backspace, NUL, newline and tab unless kept), DEL, the C1 controls
U+0080-U+009F (0x9b is a CSI on its own), bidirectional overrides and isolates (a file name shown backwards), line
and paragraph separators (YAML readers take them as line breaks), and lone surrogates (an undecodable byte of a file
name, which `surrogateescape` would write back raw)."""

from __future__ import annotations

import functools

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_FORMAT = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
_SURROGATES = range(0xD800, 0xE000)


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_TABLE = {c: _escaped(c) for c in (*_CONTROLS, *_FORMAT, *_SURROGATES)}
_KEEP = {"\n": "\n", "\t": "\t", "\r": "\r"}


def printable(text: str, keep: str = "\n\t") -> str:
    """`text` with every control, bidi and surrogate character shown escaped, but those in `keep`."""
    if text.isprintable():
        return text  # the common case (isprintable() is False for C0, C1, bidi, separators and surrogates)
    return text.translate(_table(keep))


@functools.cache
def _table(keep: str) -> dict[int, str]:
    return {**_TABLE, **{ord(k): _KEEP[k] for k in keep}}


def has_controls(text: str) -> bool:
    """Whether `printable` would change anything in `text` with nothing kept."""
    return printable(text, keep="") != text
