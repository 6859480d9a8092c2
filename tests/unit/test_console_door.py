"""The console door (#46): whatever a command prints, a value's control characters come out escaped, never obeyed:
escape sequences in a flag value, a dataset row or a file name cannot set the window title, clear the screen, draw
a coloured line or plant a link (OSC 8), on the CLI's real stdout and stderr, in a pipe or on a terminal, and on a
rank's console lines."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_tune.cli.app import main
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.output.console import colour, printable, render
from fsdp_tune.output.findings import format_findings
from fsdp_tune.worker.logs import Console, _Tee
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")
# a title, a screen clear, a green line, an OSC 8 link, a bell, a CSI as one C1 byte, a right-to-left override
HOSTILE = (
    "\x1b]0;PWNED\x07\x1b[2J\x1b[32mALL CHECKS PASSED\x1b[0m\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\\x9b2J\u202e"
)
# bytes a terminal obeys: ESC, BEL, C1 CSI (U+009B as UTF-8), the bidi override (U+202E as UTF-8), a raw 0x9b
OBEYED = (b"\x1b", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae")


def _assert_clean(data: bytes) -> None:
    for seq in OBEYED:
        assert seq not in data, f"{seq!r} reached the console: {data[:400]!r}"


def test_printable_escapes_every_control_and_keeps_text() -> None:
    shown = printable(HOSTILE + "\r\b\x00\x7f\x85\u2066\u2028\udc9b")
    assert not any(c in shown for c in "\x1b\x07\x9b\u202e\r\b\x00\x7f\x85\u2066\u2028\udc9b")
    assert "\\x1b]0;PWNED\\x07" in shown and "\\u202e" in shown and "\\udc9b" in shown
    assert printable("a\tb\nc é 日本") == "a\tb\nc é 日本"  # newline, tab and letters stay
    assert printable("a\nb", keep="") == "a\\x0ab"


def test_the_stream_colours_only_our_marks_and_only_on_a_terminal() -> None:
    ours = colour("error:", fg="red", bold=True)
    assert "\x1b" not in ours  # a mark, not a code, until the stream renders it
    assert render(ours + " " + HOSTILE, tty=True).startswith("\x1b[31m\x1b[1merror:\x1b[0m \\x1b]0;")
    assert render(ours, tty=False) == "error:"
    forged = "\ue000" + "0" * 16 + "[32m"  # the tag's shape without this process's random digits
    assert "\x1b" not in render(forged + "ALL CHECKS PASSED", tty=True)
    shown = render(colour(HOSTILE, fg="green"), tty=True)
    assert "\\x1b]0;PWNED" in shown and "\x1b" not in re.sub(r"\x1b\[[0-9;]*m", "", shown)  # our codes only


def _cli(monkeypatch, *args: str | bytes) -> tuple[int, bytes, bytes]:
    """The whole CLI in this process, through main() (which installs the door), on byte streams."""
    out, err = io.BytesIO(), io.BytesIO()
    for name, buf in (("stdout", out), ("stderr", err)):
        stream = io.TextIOWrapper(buf, encoding="utf-8", errors="surrogateescape", write_through=True)
        monkeypatch.setattr(sys, name, stream)
    monkeypatch.setattr(sys, "argv", ["fsdp-tune", *[os.fsdecode(a) for a in args]])
    with pytest.raises(SystemExit) as ended:
        main()
    return int(ended.value.code or 0), out.getvalue(), err.getvalue()


def test_a_hostile_flag_value_reaches_the_real_console_escaped() -> None:
    """FT085 prints --model_name_or_path as given: here through the installed command's real stdout/stderr, with
    a raw 0x9b byte in argv (Python reads it as a lone surrogate and would write it back raw)."""
    value = os.fsencode("builtin:" + HOSTILE) + b"\x9b"
    cmd = [sys.executable, "-m", "fsdp_tune", "validate-config", BASE, "--model_name_or_path", value]
    r = subprocess.run(cmd, capture_output=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2
    assert b"FT085" in r.stderr and b"\\x1b]0;PWNED\\x07" in r.stderr and b"\\udc9b" in r.stderr
    _assert_clean(r.stdout + r.stderr)
    assert b"\x9b" not in r.stdout + r.stderr


def test_a_terminal_gets_our_colours_and_the_values_escaped() -> None:
    primary, secondary = pty.openpty()
    cmd = [sys.executable, "-m", "fsdp_tune", "validate-config", BASE, "--model_name_or_path", "builtin:" + HOSTILE]
    with subprocess.Popen(cmd, stdout=secondary, stderr=secondary, env={**os.environ, "HF_HUB_OFFLINE": "1"}) as p:
        os.close(secondary)
        data = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            data += chunk
        assert p.wait(timeout=120) == 2
    os.close(primary)
    assert data.startswith(b"\x1b[31m\x1b[1merror:\x1b[0m")  # our colour, on a terminal
    _, _, rest = data.partition(b"--model_name_or_path: ")
    _assert_clean(rest.split(b"\n")[0])  # the value's line: nothing in it obeyed


def _hostile_data(tmp_path: Path) -> Path:
    """A data folder whose rows and file names hold escape sequences: PF017 prints the row's role and PF019 the
    second file's name and columns."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}] * 8
    rows.append({"messages": [{"role": HOSTILE, "content": "q"}, {"role": "assistant", "content": "a"}]})
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_hostile_data_row_and_file_name_reach_the_console_escaped(tmp_path, monkeypatch, fake_ranks) -> None:
    """train through main() (its launcher path, the ranks stood in for): the pre-flight's PF017 (a row's role),
    PF010 (a path in the error) and PF019 (a file's name and its columns) print the values escaped; stdout and
    stderr carry no byte a terminal obeys."""
    data = _hostile_data(tmp_path)
    flags = ["--dataset_name", str(data), "--output_dir", str(tmp_path / "out")]
    code, out, err = _cli(monkeypatch, "train", BASE, *flags)
    assert code == 0 and b"PF017" in err and b"role '\\x1b]0;PWNED\\x07" in err, err.decode()
    _assert_clean(out + err)
    missing = tmp_path / ("gone" + HOSTILE)  # a data path that is not there: PF010 names it
    code, out, err = _cli(monkeypatch, "train", BASE, "--dataset_name", str(missing), *flags[2:])
    assert b"PF010" in err and b"gone\\x1b]0;PWNED" in err, err.decode()
    _assert_clean(out + err)
    split = tmp_path / "split" / "train"  # two files of one split: PF019 names the second and its columns
    split.mkdir(parents=True)
    row = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    (split / "a.jsonl").write_text(json.dumps(row) + "\n")
    (split / ("b" + HOSTILE.replace("/", "") + ".jsonl")).write_text(json.dumps({**row, "x" + HOSTILE: 1}) + "\n")
    code, out, err = _cli(monkeypatch, "train", BASE, "--dataset_name", str(split.parent), *flags[2:])
    assert code == 2 and b"PF019" in err and b"(messages, x\\x1b]0;PWNED" in err, err.decode()
    _assert_clean(out + err)


def test_a_finding_stays_on_its_line() -> None:
    """A newline in a value (a file name, a row) is shown escaped: no value draws a line of its own."""
    f = Finding("PF019", Severity.ERROR, "train", "a\nok: ALL CHECKS PASSED", "cols x\ny", "hint\nz")
    text = format_findings("s", [f])
    assert text.count("\n") == 2 and "a\\x0aok: ALL CHECKS PASSED" in text and "\nok:" not in text


def test_a_ranks_console_lines_are_cleaned() -> None:
    """worker/logs.py's Console (phases, the progress line, warnings) and the --verbose copy of what a rank
    prints."""
    out, log = io.StringIO(), io.StringIO()
    console = Console(out, out, log, live=True)
    console.line("data: " + HOSTILE)
    console.status("step 1/2 " + HOSTILE)
    _assert_clean(out.getvalue().encode())
    assert "\\x1b]0;PWNED" in out.getvalue() and "\r" in out.getvalue()  # the live line's own \r stays
    shown = io.StringIO()
    _Tee(shown, io.StringIO()).write("bar 50%\r" + HOSTILE)
    _assert_clean(shown.getvalue().encode())


def test_torchrun_stderr_echoed_under_verbose_is_cleaned_and_logged_whole(tmp_path, capsys) -> None:
    """--verbose copies torchrun's stderr (the ranks' own: a library's warning, a traceback quoting a row) to the
    console: escaped there, as written in the log; a character split between two writes is decoded whole."""
    from fsdp_tune.launch.torchrun import _pump

    script = (
        "import sys, time; e = sys.stderr.buffer; e.write(b'row \\x1b]0;pwned\\x07 caf\\xc3'); e.flush(); "
        "time.sleep(0.2); e.write(b'\\xa9 \\xe2\\x80\\xae end\\n'); e.flush()"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE)
    tail = bytearray()
    log = tmp_path / "logs" / "torchrun.log"
    _pump(proc, tail, log, echo=True)
    proc.wait()
    shown = capsys.readouterr().err
    assert "\x1b" not in shown and "\u202e" not in shown and "\x07" not in shown
    assert "\\x1b]0;pwned\\x07" in shown and "café" in shown and "end" in shown
    assert log.read_bytes() == b"row \x1b]0;pwned\x07 caf\xc3\xa9 \xe2\x80\xae end\n"
    assert bytes(tail) == log.read_bytes()
