"""Rows of a local data file, read cheaply on the launcher (no `datasets`; pyarrow for parquet and arrow), each
with where it is (`file:line`, or `file row N` for columnar files), for pre-flight's detection and row checks.
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdp_tune.sources.data import DISK

MAX_ROWS = 100_000  # text files: rows kept for detection and the row checks (every line is parsed)
SCAN_SECONDS = 60.0  # text files: lines past MAX_ROWS are parsed for this long at most, then it is said
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which `datasets` reads past
MAX_COLUMNAR_ROWS = 10_000  # parquet / arrow: typed columns, so the first rows are enough to look at


@dataclass
class Sample:
    path: str
    rows: list[tuple[str, Any]] = field(default_factory=list)  # (where, row)
    columns: list[str] = field(default_factory=list)  # the schema's names, or every key seen
    problem: tuple[str, str, str, str] | None = None  # (rule, where, message, hint): the file cannot be read
    unscanned: int | None = None  # the line where parsing stopped at SCAN_SECONDS (None: the whole file)


def read_sample(path: str, loader: str) -> Sample:
    """Rows of one file (loader as in sources/data.py: json, csv, parquet, arrow, disk)."""
    try:
        if loader in ("parquet", "arrow", "disk"):
            return _columnar(path, loader)
        return _text(path, loader)
    except OSError as e:
        return Sample(path, problem=("PF012", path, f"cannot be read: {e.strerror or e}", "check the file"))


def _text(path: str, loader: str) -> Sample:
    """Text files are read as a stream, line by line (a file larger than memory is fine): every line is parsed,
    the first MAX_ROWS kept; past them, for SCAN_SECONDS at most (then said: Sample.unscanned)."""
    if loader == "csv":
        return _csv(path)
    with open(path, "rb") as f:
        head = f.read(64).removeprefix(BOM).lstrip()
    if path.lower().endswith(".json") and head.startswith(b"["):
        return _json_array(path)
    return _json_lines(path)


def every_json_row(path: str) -> list[Any]:
    """Every row of a JSON or JSON Lines file, parsed as the pre-flight parses it (json.loads: a string stays a
    string), for rank 0 where `datasets` would not read a row as written (worker/data/splits.py). No cap: the
    pre-flight has already refused a file it cannot parse."""
    with open(path, "rb") as f:
        head = f.read(64).removeprefix(BOM).lstrip()
    if path.lower().endswith(".json") and head.startswith(b"["):
        return json.loads(Path(path).read_bytes().decode("utf-8-sig"))
    with open(path, "rb") as f:
        return [json.loads(raw.removeprefix(BOM)) for raw in f if raw.strip()]


def _not_utf8(path: str, line: int) -> Sample:
    hint = "re-encode the file as UTF-8 (iconv -t UTF-8)"
    return Sample(path, problem=("PF011", f"{path}:{line}", "not UTF-8 text", hint))


def _json_lines(path: str) -> Sample:
    rows: list[tuple[str, Any]] = []
    keys = _Keys()
    deadline = time.monotonic() + SCAN_SECONDS
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(raw.removeprefix(BOM) if lineno == 1 else raw, object_pairs_hook=keys)
            except UnicodeDecodeError:
                return _not_utf8(path, lineno)
            except json.JSONDecodeError as e:
                message = f"malformed JSON line: {e.msg}"
                return Sample(path, problem=("PF012", where, message, "fix or remove that line"))
            if keys.twice is not None:
                return Sample(path, problem=keys.problem(where))
            if len(rows) < MAX_ROWS:
                rows.append((where, row))
            elif lineno % 4096 == 0 and time.monotonic() > deadline:
                return Sample(path, rows, _keys(rows), unscanned=lineno)
    return Sample(path, rows, _keys(rows))


def _json_array(path: str) -> Sample:
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return _not_utf8(path, raw[: e.start].count(b"\n") + 1)
    keys = _Keys()
    try:
        data = json.loads(text, object_pairs_hook=keys)
    except json.JSONDecodeError as e:
        return Sample(path, problem=("PF012", f"{path}:{e.lineno}", f"malformed JSON: {e.msg}", "fix the JSON"))
    if keys.twice is not None:
        return Sample(path, problem=keys.problem(path))
    rows = [(f"{path} row {i + 1}", r) for i, r in enumerate(data[:MAX_ROWS])]
    return Sample(path, rows, _keys(rows))


def _csv(path: str) -> Sample:
    """CSV/TSV as text (the ranks read the cells as text too: worker/data/splits.py)."""
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
    rows: list[tuple[str, Any]] = []
    deadline = time.monotonic() + SCAN_SECONDS
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        try:
            for n, row in enumerate(reader, 1):
                where = f"{path}:{reader.line_num}"
                if None in row:  # DictReader's restkey: more cells than the header names
                    message = f"{len(reader.fieldnames or [])} columns in the header, more cells in this row"
                    return Sample(path, problem=("PF012", where, message, "quote cells that hold the delimiter"))
                if n <= MAX_ROWS:
                    rows.append((where, row))
                elif n % 4096 == 0 and time.monotonic() > deadline:
                    return Sample(path, rows, list(reader.fieldnames or []), unscanned=reader.line_num)
        except UnicodeDecodeError:
            return _not_utf8(path, reader.line_num + 1)
        except csv.Error as e:
            return Sample(path, problem=("PF012", f"{path}:{reader.line_num}", f"malformed CSV: {e}", "fix that line"))
    return Sample(path, rows, list(reader.fieldnames or []))


class _Keys:
    """json's object_pairs_hook noting the first key given twice in an object (json keeps the last one without a
    word; `datasets` refuses the file on rank 0: "Column(/prompt) was specified twice")."""

    def __init__(self) -> None:
        self.twice: str | None = None

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) < len(pairs) and self.twice is None:
            seen: set[str] = set()
            self.twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        return out

    def problem(self, where: str) -> tuple[str, str, str, str]:
        return ("PF012", where, f"the key {self.twice!r} is given twice in one object", "keep one of them")


def _keys(rows: list[tuple[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for _, row in rows:
        if isinstance(row, dict):
            seen.update(dict.fromkeys(row))
    return list(seen)


def _columnar(path: str, loader: str) -> Sample:
    import pyarrow as pa

    files = sorted(str(p) for p in Path(path).glob("*.arrow")) if loader == DISK else [path]
    if not files:
        return Sample(path, problem=("PF012", path, "a save_to_disk folder without .arrow files", "save it again"))
    rows: list[tuple[str, Any]] = []
    columns: list[str] = []
    for f in files:
        try:
            batches, names = _batches(f, loader)
        except (pa.ArrowException, OSError, ValueError) as e:
            kind = "parquet" if loader == "parquet" else "Arrow"
            message = f"cannot be read as {kind}: {str(e).splitlines()[0][:160]}"
            return Sample(path, problem=("PF012", f, message, "write the file again, or remove it"))
        columns = columns or names
        for batch in batches:
            rows += [(f"{path} row {len(rows) + i + 1}", r) for i, r in enumerate(batch.to_pylist())]
            if len(rows) >= MAX_COLUMNAR_ROWS:
                return Sample(path, rows[:MAX_COLUMNAR_ROWS], columns)
    return Sample(path, rows, columns)


def _batches(path: str, loader: str):
    """(record batches, column names) of a parquet file, or an Arrow IPC stream/file (datasets writes streams)."""
    import pyarrow as pa

    if loader == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        return pf.iter_batches(batch_size=1024), list(pf.schema_arrow.names)
    source = pa.memory_map(path)
    try:
        reader = pa.ipc.open_stream(source)
        return iter(reader), list(reader.schema.names)
    except pa.ArrowInvalid:
        reader = pa.ipc.open_file(pa.memory_map(path))
        return (reader.get_batch(i) for i in range(reader.num_record_batches)), list(reader.schema.names)
