"""Tiny image datasets the tests write (pillow, no torch): rows that mix images and text-only turns, in the three
spellings fsdp-tune reads (sources/vision.py), with paths relative to the data file's folder."""

from __future__ import annotations

import json
from pathlib import Path

COLORS = {"red": (220, 30, 30), "green": (30, 190, 40), "blue": (30, 40, 220)}
SIZES = ((40, 40), (64, 48), (30, 80))


def write_images(folder: Path, n: int) -> list[str]:
    """n solid-colour PNGs of a few sizes under folder/img; their paths relative to `folder`."""
    from PIL import Image

    (folder / "img").mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(n):
        rgb = list(COLORS.values())[i % len(COLORS)]
        Image.new("RGB", SIZES[i % len(SIZES)], rgb).save(folder / "img" / f"{i}.png")
        names.append(f"img/{i}.png")
    return names


def image_row(i: int, path: str, spelling: str = "messages") -> dict:
    color = list(COLORS)[i % len(COLORS)]
    if spelling == "sharegpt":
        turns = [{"from": "human", "value": "<image>What color is this?"}, {"from": "gpt", "value": f"It is {color}."}]
        return {"conversations": turns, "images": [path]}
    if spelling == "inline":
        question = [{"type": "image", "image": path}, {"type": "text", "text": "What color is this?"}]
        return {
            "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is {color}."}]
        }
    question = [{"type": "image"}, {"type": "text", "text": "What color is this?"}]
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is {color}."}]
    return {"messages": messages, "images": [path]}


def text_row(spelling: str = "messages") -> dict:
    if spelling == "sharegpt":
        return {"conversations": [{"from": "human", "value": "Say hello."}, {"from": "gpt", "value": "Hello there."}]}
    return {"messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there."}]}


def write_mixed(folder: Path, n: int = 24, spelling: str = "messages") -> Path:
    """folder/train.jsonl: even rows hold an image, odd rows are text only (on 2 ranks reading in order, one rank's
    batches have images while the other's have none)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = write_images(folder, n)
    rows = [image_row(i, paths[i], spelling) if i % 2 == 0 else text_row(spelling) for i in range(n)]
    if spelling != "inline":  # the images column: empty for a text-only row
        for row in rows:
            row.setdefault("images", [])
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
