"""Images in the data, in pure Python (no torch, no `datasets`, no PIL): a row's images and where its messages place
them, as TRL represents vision data (messages whose `content` is a list of {"type": "image"} / {"type": "text"}
blocks, and an `images` list beside them, in the order the blocks name them).

Three spellings are read:
    messages with content blocks + an `images` column (TRL's, HuggingFaceM4's datasets)
    blocks carrying their image ({"type": "image", "image": "a.png"}): moved into `images`, in order
    `<image>` placeholders in string contents (ShareGPT, LLaMA-Factory's mllm_demo) + an `images` column: each
    placeholder becomes an image block where it stands
An image is a path (relative paths are read from the dataset's folder: the folder named, or the file's), bytes,
{"bytes", "path"} as `datasets`' Image feature stores it, or a PIL image (a Hub dataset, on rank 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fsdp_tune.sources.formats import decode_json

PLACEHOLDER = "<image>"
IMAGE = "image"
URL_PREFIXES = ("http://", "https://")


def refs(value: Any) -> list[Any]:
    """The images column of a row as a list (None and "" are none; one image is a list of one; JSON text decoded)."""
    value = decode_json(value)
    if value is None or value == "":
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if v is not None]
    return [value]


def is_image_block(block: Any) -> bool:
    return isinstance(block, Mapping) and (block.get("type") == IMAGE or (IMAGE in block and "type" not in block))


def with_blocks(messages: list[dict], placeholders: bool) -> tuple[list[dict], list[Any]]:
    """(the messages with every image as a {"type": "image"} block, the images blocks carried inline, in order).
    `placeholders`: the row has an images column, so `<image>` in a string content stands for one of them."""
    out, inline = [], []
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            blocks = []
            for block in content:
                if is_image_block(block):
                    if block.get(IMAGE) is not None:
                        inline.append(block[IMAGE])
                    blocks.append({"type": IMAGE})
                else:
                    blocks.append(block)
            message = {**message, "content": blocks}
        elif placeholders and isinstance(content, str) and PLACEHOLDER in content:
            message = {**message, "content": split_placeholders(content)}
        out.append(message)
    return out, inline


def split_placeholders(text: str) -> list[dict]:
    """'<image>What is this?' -> [{"type": "image"}, {"type": "text", "text": "What is this?"}]."""
    blocks: list[dict] = []
    for i, part in enumerate(text.split(PLACEHOLDER)):
        if i:
            blocks.append({"type": IMAGE})
        if part:
            blocks.append({"type": "text", "text": part})
    return blocks


def image_blocks(messages: Any) -> int:
    """How many image blocks the converted messages hold."""
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for m in messages
        if isinstance(m, Mapping) and isinstance(m.get("content"), list)
        for b in m["content"]
        if is_image_block(b)
    )


def count_problem(converted: Mapping[str, Any]) -> str | None:
    """Why a converted row's images do not line up with its image blocks (None when they do)."""
    if "images" not in converted:
        return None
    blocks, images = image_blocks(converted.get("messages")), len(converted["images"])
    if blocks == images:
        return None
    return f"{blocks} image placeholder(s) for {images} image(s)"


def image_root(source_path: str, files: list[str]) -> Path:
    """The folder relative image paths are read from: the dataset's folder, or the folder of the file named."""
    path = Path(source_path).expanduser()
    if path.is_dir():
        return path
    if path.is_file():
        return path.parent
    return Path(files[0]).parent if files else Path.cwd()


def resolve(ref: Any, root: Path) -> Any:
    """A path image made absolute (relative to `root`); bytes, {"bytes", ...} and PIL images as they are."""
    if isinstance(ref, Mapping) and ref.get("bytes") is None and ref.get("path"):
        ref = ref["path"]
    if isinstance(ref, str) and not ref.startswith(URL_PREFIXES):
        path = Path(ref).expanduser()
        return str(path if path.is_absolute() else (root / path))
    return ref


def describe(ref: Any) -> str:
    """An image as people read it in an error: its path, or what kind of value it is."""
    if isinstance(ref, str):
        return ref
    if isinstance(ref, Mapping) and ref.get("path"):
        return str(ref["path"])
    if isinstance(ref, (bytes, bytearray)) or (isinstance(ref, Mapping) and ref.get("bytes") is not None):
        return "an image given as bytes"
    return f"a {type(ref).__name__}"
