"""The images of local data, read before launch (PIL, no torch): each image a row names is found and opened (its
header read and verified), and each row's image placeholders are counted against its images. A missing file, an
image that does not open, a URL (the ranks read files and bytes) or a row whose placeholders and images differ in
number is refused (PF078, PF079) with its file and line: on the ranks it would stop the run mid-training (the
processor's "Image features and image tokens do not match", a PIL error in the collator), after the data and the
model were loaded. What pre-flight found (rows with images, images, the largest) goes into the rank spec
(Source.images) for the checks that need the model and the trainer (preflight/vision.py) and for `plan`.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight.tokens import listed
from fsdp_tune.sources import vision
from fsdp_tune.sources.convert import to_trl
from fsdp_tune.sources.formats import FIELDS, MESSAGES, SHAREGPT, Format
from fsdp_tune.sources.mixture import Source

SECONDS = 60.0  # for the images of one source's splits
IMAGE_KINDS = (MESSAGES, SHAREGPT)  # the formats whose rows carry images (sources/vision.py)
IMAGE_COLUMNS = FIELDS[MESSAGES]["images"]


@dataclass
class Found:
    """What one split's images were: rows with and without images, the images opened, the largest (w, h)."""

    image_rows: int = 0
    text_rows: int = 0
    images: int = 0
    largest: tuple[int, int] = (0, 0)
    unchecked_from: str | None = None  # the row where the time ran out (later images: rank 0 reads them)
    problems: dict[str, list[str]] = field(default_factory=dict)  # what is wrong -> where (file:line: image)

    def as_dict(self) -> dict[str, Any]:
        return {
            "image_rows": self.image_rows,
            "text_rows": self.text_rows,
            "images": self.images,
            "largest": list(self.largest),
            "unchecked_from": self.unchecked_from,
        }


def split_images(split: str, rows: list, fmt: Format, source: Source, columns: list[str], files: dict) -> tuple:
    """(what a split's images are, or None for data without any; their findings), for preflight/data.py."""
    if fmt.kind not in IMAGE_KINDS:
        named = [c for c in columns if c in IMAGE_COLUMNS]
        if not named:
            return None, []
        message = f"a {fmt.kind} dataset with a column {named[0]!r}: images are read from messages and ShareGPT data"
        hint = "convert the rows to messages with image blocks, or drop the column (it is not trained on)"
        return None, [Finding("PF080", Severity.WARNING, split, files[split][0], message, hint)]
    root = vision.image_root(source.path, [f for group in files.values() for f in group])
    found = check_images(rows, fmt, source.roles, root, time.monotonic() + SECONDS)
    seen = found.as_dict() if found.image_rows or "images" in fmt.columns else None
    return seen, findings(split, found)


def check_images(rows: list[tuple[str, Any]], fmt: Format, roles: dict, root: Path, deadline: float) -> Found:
    """Every row's images counted against its placeholders and opened, until `deadline` (time.monotonic())."""
    found = Found()
    for where, row in rows:
        if not isinstance(row, Mapping):
            continue
        try:
            converted = to_trl(row, fmt, roles)
        except (TypeError, AttributeError, KeyError, ValueError):
            continue  # rowcheck reports it (unreadable)
        images = converted.get("images") or []
        counted = vision.count_problem(converted)
        if counted:
            found.problems.setdefault(f"the image placeholders do not match the images ({counted})", []).append(where)
        if not images:
            found.text_rows += "messages" in converted
            continue
        found.image_rows += 1
        if found.unchecked_from is None and time.monotonic() > deadline:
            found.unchecked_from = where
        if found.unchecked_from is not None:
            continue
        for ref in images:
            size, why = open_image(vision.resolve(ref, root))
            if why:
                found.problems.setdefault(why, []).append(f"{where} ({vision.describe(ref)})")
                continue
            found.images += 1
            found.largest = max(found.largest, size, key=lambda s: s[0] * s[1])
    return found


def open_image(ref: Any) -> tuple[tuple[int, int], str | None]:
    """((width, height), None) for an image PIL opens and verifies; ((0, 0), what is wrong) otherwise."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(ref, str) and ref.startswith(vision.URL_PREFIXES):
        return (0, 0), "an image URL: the ranks read image files and bytes, not URLs"
    try:
        if isinstance(ref, str):
            if not Path(ref).is_file():
                return (0, 0), "the image file does not exist"
            source: Any = ref
        elif isinstance(ref, Mapping) and ref.get("bytes") is not None:
            source = io.BytesIO(ref["bytes"])
        elif isinstance(ref, (bytes, bytearray)):
            source = io.BytesIO(ref)
        elif hasattr(ref, "size") and hasattr(ref, "mode"):  # a PIL image already
            return tuple(ref.size), None
        else:
            return (0, 0), f"not an image: {type(ref).__name__} (a path, bytes or {{bytes, path}})"
        with Image.open(source) as image:
            size = image.size
            image.verify()  # the file's structure and checksums, without decoding every pixel
        return size, None
    except Image.DecompressionBombError as e:  # PIL's bound: rank 0 skips the row (sources/vision_rows.py)
        return (0, 0), f"the image is too large to decode safely ({str(e)[:100]})"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        return (0, 0), f"the image cannot be read ({type(e).__name__}: {str(e)[:80]})"


def findings(split: str, found: Found) -> list[Finding]:
    """PF079 placeholder counts, PF078 images that do not open: errors with their rows; PF072 a note when the time
    ran out before every image was opened."""
    out = []
    for problem, wheres in found.problems.items():
        rule = "PF079" if problem.startswith("the image placeholders") else "PF078"
        hint = (
            "give each row as many images as its image blocks or <image> placeholders"
            if rule == "PF079"
            else "fix the path (relative paths are read from the dataset's folder) or the file, or drop the row"
        )
        message = f"{len(wheres)} row(s): {problem}: {listed(wheres)}"
        out.append(Finding(rule, Severity.ERROR, split, wheres[0].split(" (")[0], message, hint))
    if found.unchecked_from is not None:
        message = (
            f"the images were opened up to {found.unchecked_from} within {SECONDS:.0f} s; rank 0 reads the rest "
            "(a row whose image does not open there is skipped and counted)"
        )
        out.append(Finding("PF072", Severity.NOTE, split, found.unchecked_from, message, ""))
    return out
