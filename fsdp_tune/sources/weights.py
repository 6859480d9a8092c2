"""A local model's safetensors files: all there and whole, read from their headers only (a few KiB each).

A shard missing from the index, or a file shorter than its header says (an interrupted copy), fails only
after every rank has loaded the others; pre-flight finds it first.
"""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_tune.errors import Finding, Severity


def check_weights(folder: Path, name: str) -> list[Finding]:
    """A local model's safetensors files are all there and whole: a shard missing from the index, or a file
    shorter than its header says (an interrupted copy), fails only after every rank has loaded the others.
    Reads the headers only (a few KiB a file)."""
    index = folder / "model.safetensors.index.json"
    files = sorted(folder.glob("*.safetensors"))
    problems = []
    if index.exists():
        try:
            wanted = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError) as e:
            wanted = set()
            problems.append(f"{index.name} is unreadable ({e})")
        missing = sorted(wanted - {f.name for f in files})
        if missing:
            problems.append(f"{len(missing)} shard(s) named in {index.name} are missing: {', '.join(missing[:3])}")
    for f in files:
        why = _safetensors_problem(f)
        if why:
            problems.append(f"{f.name} {why}")
    if not problems:
        return []
    return [
        Finding(
            "PF004",
            Severity.ERROR,
            "--model_name_or_path",
            "command line",
            f"{name}: {'; '.join(problems[:3])}",
            "copy or download the model again (huggingface-cli download resumes)",
        )
    ]


def _safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file is not whole, from its header: 8 bytes of length, a JSON table of offsets."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "is empty or cut short"
            length = int.from_bytes(head, "little")
            if length > size - 8:
                return "is cut short (its header is longer than the file)"
            table = json.loads(f.read(length))
        end = max((v["data_offsets"][1] for k, v in table.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        return f"has an unreadable header ({e.__class__.__name__})"
    if 8 + length + end > size:
        return f"is cut short ({size} bytes of {8 + length + end})"
    return None
