"""Where a dataset comes from, and a cheap look inside local files (no `datasets` import).

Shared by the launcher's pre-flight (bad data is found before any rank starts, with file and line) and
the worker (which loads it with `datasets`).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from fsdp_tune.errors import Finding, Severity

BUILTIN = {"builtin:demo-chat": "demo_chat"}
EXTENSIONS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
class DataSource:
    """A hub name (`files` empty) or local files by split."""

    name: str
    files: dict[str, Path]

    @property
    def is_local(self) -> bool:
        return bool(self.files)

    @property
    def loader(self) -> str:
        return EXTENSIONS[next(iter(self.files.values())).suffix.lower()]


def resolve(name: str, splits: tuple[str, ...]) -> DataSource:
    """Map `--dataset_name` to files: a builtin, a file (its one split is the first), a folder of SPLIT.ext."""
    if name in BUILTIN:
        base = Path(str(resources.files("fsdp_tune.assets").joinpath(BUILTIN[name])))
        return DataSource(name, {s: base / f"{s}.jsonl" for s in splits if (base / f"{s}.jsonl").exists()})
    path = Path(name).expanduser()
    if path.is_file():
        return DataSource(name, {splits[0] if splits else "train": path})
    if path.is_dir():
        found: dict[str, Path] = {}
        for split in splits:
            for ext in EXTENSIONS:
                candidate = path / f"{split}{ext}"
                if candidate.exists():
                    found[split] = candidate
                    break
        return DataSource(name, found)
    return DataSource(name, {})


def looks_local(name: str) -> bool:
    return name in BUILTIN or name.startswith((".", "/", "~")) or Path(name).suffix.lower() in EXTENSIONS


def check_local(
    source: DataSource, splits: tuple[str, ...], text_field: str, chat: bool, max_rows: int = 100_000
) -> list[Finding]:
    """Every local row parses, is UTF-8, and has `messages` or the text field; no split is empty."""
    findings: list[Finding] = []
    if not source.files:
        wanted = ", ".join(f"{s}.jsonl" for s in splits)
        findings.append(
            Finding(
                "PF010",
                Severity.ERROR,
                "--dataset_name",
                "command line",
                f"{source.name}: no data files for splits {', '.join(splits)}",
                f"put {wanted} (or .json/.parquet/.csv) in that folder",
            )
        )
        return findings
    for split, path in source.files.items():
        findings += _check_file(path, split, text_field, chat, max_rows)
    return findings


def _field_hint(text_field: str) -> str:
    return f"each row needs `messages` (a chat) or `{text_field}` (plain text): set --dataset_text_field"


def _check_file(path: Path, split: str, text_field: str, chat: bool, max_rows: int) -> list[Finding]:
    if path.suffix.lower() == ".parquet":
        return []  # columnar and typed: `datasets` reports its schema precisely at load
    rows, problem = _read_rows(path, split, max_rows)
    if problem:
        return [problem]
    if not rows:
        return [
            Finding(
                "PF013",
                Severity.ERROR,
                split,
                str(path),
                f"the {split} split is empty",
                "add rows, or drop the split from --splits",
            )
        ]
    return _check_rows(rows, path, split, text_field)


def _read_rows(path: Path, split: str, max_rows: int) -> tuple[list[tuple[int, object]], Finding | None]:
    """(line number, row) of up to max_rows rows, or the first reason the file cannot be read."""
    suffix = path.suffix.lower()
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        hint = "re-encode the file as UTF-8 (iconv -t UTF-8)"
        return [], Finding("PF011", Severity.ERROR, split, f"{path}:{line}", "not UTF-8 text", hint)
    rows: list[tuple[int, object]] = []
    if suffix == ".jsonl" or (suffix == ".json" and not text.lstrip().startswith("[")):
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                where = f"{path}:{lineno}"
                message = f"malformed JSON line: {e.msg}"
                return [], Finding("PF012", Severity.ERROR, split, where, message, "fix or remove that line")
            if len(rows) >= max_rows:
                break
    elif suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            return [], Finding("PF012", Severity.ERROR, split, f"{path}:{e.lineno}", f"malformed JSON: {e.msg}")
        rows = [(0, r) for r in data[:max_rows]] if isinstance(data, list) else []
    elif suffix == ".csv":
        reader = csv.DictReader(text.splitlines())
        rows = [(n + 2, r) for n, r in zip(range(max_rows), reader, strict=False)]
    return rows, None


def _check_rows(rows: list[tuple[int, object]], path: Path, split: str, text_field: str) -> list[Finding]:
    for lineno, row in rows:
        where = f"{path}:{lineno}" if lineno else str(path)

        def bad(message: str, hint: str = "fix that row", where: str = where) -> list[Finding]:
            return [Finding("PF014", Severity.ERROR, split, where, message, hint)]

        if not isinstance(row, dict):
            return bad("a row is not an object", _field_hint(text_field))
        if "messages" in row:
            msgs = row["messages"]
            if not isinstance(msgs, list) or not all(isinstance(m, dict) and "content" in m for m in msgs):
                return bad("`messages` must be a list of {role, content} objects")
        elif text_field not in row:
            return bad(
                f"row has neither `messages` nor `{text_field}` (it has: {', '.join(list(row)[:6])})",
                _field_hint(text_field),
            )
        elif not isinstance(row[text_field], str):
            return bad(f"`{text_field}` is not a string")
    return []
