"""Data files the tests write: JSON-lines files, a Hub dataset as `datasets` caches it (read offline), and every
source and format at once. Shared by the one-process data tests (tests/lib/test_data_prepare.py) and the runs
(tests/dist/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path


def jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def hub_cache(root: Path, repo: str, config: str, files: dict[str, Path]) -> None:
    """A Hub dataset as `datasets` leaves it in its cache after one online load (what offline runs read)."""
    import datasets

    builder = datasets.load_dataset_builder(
        "json", data_files={k: str(v) for k, v in files.items()}, cache_dir=str(root / "build")
    )
    builder.download_and_prepare()
    namespace, name = repo.split("/")
    dest = root / f"{namespace}___{name}" / config / "0.0.0" / "0123abcd"
    dest.parent.mkdir(parents=True)
    Path(builder.cache_dir).rename(dest)
    for f in dest.glob("json-*.arrow"):
        f.rename(dest / f.name.replace("json-", f"{name}-"))
    info = json.loads((dest / "dataset_info.json").read_text())
    (dest / "dataset_info.json").write_text(json.dumps({**info, "config_name": config}))


def _qa(i: int) -> tuple[str, str]:
    return f"What is {i} plus 1?", f"{i} plus 1 is {i + 1}."


def every_source(root: Path) -> list[dict]:
    """Nine datasets, five formats, every kind of local source and a Hub dataset from the offline cache: the
    `datasets` entries of a recipe; the Hub dataset is cached in root/hub (the run's HF_DATASETS_CACHE)."""
    import datasets

    root.mkdir(parents=True)
    q = [_qa(i) for i in range(40)]
    alpaca = [{"instruction": p, "input": "", "output": a} for p, a in q]
    sharegpt = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]} for p, a in q]
    messages = [
        {"messages": json.dumps([{"role": "user", "content": p}, {"role": "assistant", "content": a}])} for p, a in q
    ]
    chat_pc = [
        {"prompt": [{"role": "user", "content": p}], "completion": [{"role": "assistant", "content": a}]} for p, a in q
    ]
    plain_pc = [{"prompt": p, "completion": " " + a} for p, a in q]
    text = [{"text": f"{p} {a}"} for p, a in q]
    (root / "sharegpt.json").write_text(json.dumps(sharegpt))  # a JSON array
    datasets.Dataset.from_list(messages).to_csv(str(root / "messages.csv"), index=False)  # JSON text in cells
    datasets.Dataset.from_list(chat_pc).to_parquet(str(root / "chat_pc.parquet"))
    datasets.Dataset.from_list(text).save_to_disk(str(root / "text_saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(plain_pc)}).save_to_disk(str(root / "pc_dict"))
    jsonl(root / "shards" / "part-0.jsonl", alpaca[:20])
    jsonl(root / "shards" / "part-1.jsonl", alpaca[20:])
    hub_cache(root / "hub", "acme/qa", "default", {"train": jsonl(root / "hub.jsonl", sharegpt)})
    return [
        {"path": str(jsonl(root / "alpaca.jsonl", alpaca)), "samples": 12},
        {"path": str(root / "sharegpt.json"), "weight": 1},
        {"path": str(root / "messages.csv"), "weight": 1},
        {"path": str(root / "chat_pc.parquet"), "split": "train[:50%]"},
        {"path": str(next((root / "text_saved").glob("*.arrow")))},  # an Arrow file
        {"path": str(root / "pc_dict"), "samples": 8},  # a save_to_disk folder
        {"path": str(root / "shards"), "samples": 8},  # a folder of files
        {"path": "json", "data_files": str(root / "shards" / "*.jsonl"), "samples": 4, "format": "alpaca"},
        {"path": "acme/qa", "split": "train[:10]"},  # the Hub, offline, from datasets' cache
    ]
