"""Checkpoint files as DCP and the Trainer write them, built without torch: the same pickles (DCP's Metadata
pointing at torch.save archives inside the shards, torch.save archives for scheduler and rng states), so the
launcher's pickle check reads them as it reads real ones. And the crafted kind: a pickle that runs a command.

Pickles of this module's stand-in classes are renamed to DCP's classes (protocol 2 writes a class as the text
`module\\nname\\n`, so the bytes can be swapped); tests/dist checks the real files of real runs.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path


class Metadata:
    def __init__(self, storage_data: dict):
        self.state_dict_metadata: dict = {}
        self.planner_data: dict = {}
        self.storage_data = storage_data
        self.storage_meta = None
        self.version = "1.0.0"


class MetadataIndex:
    def __init__(self, fqn: str):
        self.fqn, self.offset, self.index = fqn, None, None


class _StorageInfo:
    def __init__(self, relative_path: str, offset: int, length: int):
        self.relative_path, self.offset, self.length, self.transform_descriptors = relative_path, offset, length, None


_AS = {
    Metadata: "torch.distributed.checkpoint.metadata\nMetadata",
    MetadataIndex: "torch.distributed.checkpoint.metadata\nMetadataIndex",
    _StorageInfo: "torch.distributed.checkpoint.filesystem\n_StorageInfo",
}


class RunsCommand:
    """Unpickled, it runs `command` (os.system): what a crafted checkpoint holds."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def as_dcp(obj) -> bytes:
    raw = pickle.dumps(obj, protocol=2)
    for cls, name in _AS.items():
        raw = raw.replace(f"{__name__}\n{cls.__name__}\n".encode(), f"{name}\n".encode())
    return raw


def archive(data_pkl: bytes, name: str = "archive") -> bytes:
    """A torch.save zip archive around `data_pkl`."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{name}/data.pkl", data_pkl)
        z.writestr(f"{name}/byteorder", "little")
        z.writestr(f"{name}/version", "3\n")
    return buf.getvalue()


def write_dcp(folder: Path, ranks: int, step: int, item: bytes | None = None) -> None:
    """`folder`/.metadata and one __K_0.distcp per rank, each holding two items (torch.save archives).
    `item`: the data.pkl of rank 1's second item (a crafted one), instead of plain numbers."""
    folder.mkdir(parents=True, exist_ok=True)
    storage = {}
    for rank in range(ranks):
        shard = b""
        for k in range(2):
            pkl = item if (item is not None and rank == 1 and k == 1) else pickle.dumps([step, rank, k], protocol=2)
            data = archive(pkl, f"item{k}")
            storage[MetadataIndex(f"w{rank}.{k}")] = _StorageInfo(f"__{rank}_0.distcp", len(shard), len(data))
            shard += data
        (folder / f"__{rank}_0.distcp").write_bytes(shard)
    (folder / ".metadata").write_bytes(as_dcp(Metadata(storage)))


def write_trainer_files(folder: Path, ranks: int, step: int) -> None:
    """What the Trainer writes besides the FSDP folders: scheduler, rng states, trainer_state.json."""
    folder.mkdir(parents=True, exist_ok=True)
    scheduler = {"last_epoch": step, "_last_lr": [0.005 / (step + 1)], "lr_lambdas": [None]}
    (folder / "scheduler.pt").write_bytes(archive(pickle.dumps(scheduler, protocol=2), "scheduler"))
    for rank in range(ranks):
        rng = OrderedDict(python=(3, tuple(range(step, step + 8)), None), rank=rank)
        (folder / f"rng_state_{rank}.pth").write_bytes(archive(pickle.dumps(rng, protocol=2), f"rng_state_{rank}"))
    (folder / "trainer_state.json").write_text(f'{{"global_step": {step}, "train_batch_size": 4}}')
