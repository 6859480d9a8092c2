"""Rows of a local data file, read cheaply on the launcher (no `datasets`; pyarrow for parquet and arrow), each
with where it is (`file:line`, or `file row N` for columnar files), for pre-flight's detection and row checks.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdp_tune.sources.data import DISK

MAX_ROWS = 100_000  # text files: every row up to this many is parsed (a broken line anywhere is found)
MAX_COLUMNAR_ROWS = 10_000  # parquet / arrow: typed columns, so the first rows are enough to look at


@dataclass
class Sample:
    path: str
    rows: list[tuple[str, Any]] = field(default_factory=list)  # (where, row)
    columns: list[str] = field(default_factory=list)  # the schema's names, or every key seen
    problem: tuple[str, str, str, str] | None = None  # (rule, where, message, hint): the file cannot be read


def read_sample(path: str, loader: str) -> Sample:
    """Rows of one file (loader as in sources/data.py: json, csv, parquet, arrow, disk)."""
    try:
        if loader in ("parquet", "arrow", "disk"):
            return _columnar(path, loader)
        return _text(path, loader)
    except OSError as e:
        return Sample(path, problem=("PF012", path, f"cannot be read: {e.strerror or e}", "check the file"))


def _text(path: str, loader: str) -> Sample:
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        where = f"{path}:{line}"
        return Sample(path, problem=("PF011", where, "not UTF-8 text", "re-encode the file as UTF-8 (iconv -t UTF-8)"))
    if loader == "csv":
        delimiter = "\t" if path.lower().endswith(".tsv") else ","
        reader = csv.DictReader(text.splitlines(), delimiter=delimiter)
        rows = [(f"{path}:{reader.line_num}", row) for _, row in zip(range(MAX_ROWS), reader, strict=False)]
        return Sample(path, rows, list(reader.fieldnames or []))
    if path.lower().endswith(".json") and text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            return Sample(path, problem=("PF012", f"{path}:{e.lineno}", f"malformed JSON: {e.msg}", "fix the JSON"))
        rows = [(f"{path} row {i + 1}", r) for i, r in enumerate(data[:MAX_ROWS])]
        return Sample(path, rows, _keys(rows))
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}:{lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
            where = f"{path}:{lineno}"
            return Sample(path, problem=("PF012", where, f"malformed JSON line: {e.msg}", "fix or remove that line"))
        if len(rows) >= MAX_ROWS:
            break
    return Sample(path, rows, _keys(rows))


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
