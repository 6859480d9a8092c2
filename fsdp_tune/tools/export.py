"""`fsdp-tune export RUN/checkpoint-N -o FOLDER`: a sharded checkpoint's adapter as a PEFT adapter folder.

A SHARDED_STATE_DICT checkpoint keeps the adapter inside FSDP's distributed checkpoint (DCP) files,
pytorch_model_fsdp_0/, which only torch.distributed.checkpoint reads. What accelerate writes there for a PEFT model
is PEFT's own adapter state dict (get_peft_model_state_dict: the keys of adapter_model.safetensors) under the
"model." prefix (accelerate 1.15 fsdp_utils save_fsdp_model, by reading; tests/dist/test_export.py checks it against
a run's final adapter). It is read here on one process without a process group (dcp.load(no_dist=True), what
accelerate's merge_fsdp_weights does through torch's private helper), after every pickle in it was checked to be
data (rundir/pickles.py), and written beside the checkpoint's adapter_config.json as adapter_model.safetensors.

The folder written is what `chat` and `merge` take: the run's tokenizer files and its records (the rank spec: the
dtype, 4-bit and trust the run loaded its base with; the manifest: where the base was) travel with the adapter, so
`fsdp-tune chat FOLDER` loads step N as `fsdp-tune chat RUN` loads the final adapter. Every file goes through the
writer door (output/files.py).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from fsdp_tune.config.folders import FolderRefused, check_adapter, read_json
from fsdp_tune.errors import UsageError
from fsdp_tune.output.files import write_out
from fsdp_tune.runfiles import ADAPTER_CONFIG, ADAPTER_WEIGHTS, MANIFEST_NAME, METRICS_NAME, RESOLVED_NAME

SHARDS = "pytorch_model_fsdp_0"  # accelerate's FSDP_MODEL_NAME, the model's DCP folder (optimizer_0 is the optimizer)
PREFIX = "model."  # accelerate saves {"model": state_dict}: DCP flattens it to "model.<key>"
# what the run's folder holds besides the adapter that chat and merge read: its tokenizer (the chat template the run
# trained with), a vision-language model's processor, and fsdp-tune's records of how it loaded the base
CARRIED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "preprocessor_config.json",
    "processor_config.json",
    RESOLVED_NAME,
    MANIFEST_NAME,
)


def export(checkpoint: str, output: str, force: bool) -> dict:
    """Write the adapter of `checkpoint` (a sharded one) to `output`; returns what was written."""
    folder, out = Path(checkpoint), Path(output)
    shards = _checked(folder, out, force)
    tensors = adapter_tensors(shards)
    import safetensors.torch

    out.mkdir(parents=True, exist_ok=True)
    config = dict(read_json(folder / ADAPTER_CONFIG))
    config["inference_mode"] = True  # as the run's final adapter is written (saving/save.py write_peft_adapter)
    write_out(out / ADAPTER_CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n", force)
    data = safetensors.torch.save(tensors, metadata={"format": "pt"})
    write_out(out / ADAPTER_WEIGHTS, data, force)
    carried = [name for name in CARRIED if (folder.parent / name).is_file() and not (folder.parent / name).is_symlink()]
    for name in carried:
        write_out(out / name, (folder.parent / name).read_bytes(), force)
    return {"output": str(out), "tensors": len(tensors), "carried": carried, "step": _step(folder)}


def adapter_tensors(shards: Path) -> dict:
    """PEFT's adapter state dict from the model's DCP folder, on one process: {key in adapter_model.safetensors:
    tensor}. Refused (exit 2) when the folder holds anything but the adapter's tensors under accelerate's prefix."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from fsdp_tune.worker.saving.save import saved_name

    reader = dcp.FileSystemReader(str(shards))
    items = reader.read_metadata().state_dict_metadata
    odd = [k for k, m in items.items() if not k.startswith(PREFIX) or not isinstance(m, TensorStorageMetadata)]
    if odd or not items:
        raise FolderRefused(
            f"{shards}: not an adapter's sharded checkpoint ({'no tensors' if not items else f'holds {odd[0]}'})",
            "pass a checkpoint of a LoRA run trained with --fsdp_state_dict_type SHARDED_STATE_DICT",
        )
    state = {k: torch.empty(m.size, dtype=m.properties.dtype) for k, m in items.items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    # FSDP1's or an older accelerate's names may keep wrapper parts or the adapter's name: PEFT's file has neither
    return {saved_name(k.removeprefix(PREFIX), "default"): v.contiguous() for k, v in state.items()}


def _checked(folder: Path, out: Path, force: bool) -> Path:
    """The checkpoint's DCP folder, once the checkpoint and -o are fit: before torch is imported."""
    from fsdp_tune.rundir.pickles import check_checkpoint

    if not folder.is_dir():
        raise UsageError(f"{folder}: no such folder", "pass a checkpoint folder: RUN/checkpoint-N")
    if (folder / ADAPTER_WEIGHTS).is_file():
        raise UsageError(
            f"{folder} already holds a PEFT adapter ({ADAPTER_WEIGHTS}): nothing to export",
            f"use it as it is: fsdp-tune chat {folder}, or fsdp-tune merge --adapter {folder} -o FOLDER",
        )
    if not (folder / ADAPTER_CONFIG).is_file():
        raise UsageError(
            f"{folder} has no {ADAPTER_CONFIG}: not a checkpoint of a LoRA run",
            "pass RUN/checkpoint-N of a run trained with an adapter (a full fine-tune's checkpoint holds no adapter)",
        )
    shards = folder / SHARDS
    if not (shards / ".metadata").is_file():
        raise UsageError(
            f"{folder} has no {SHARDS}/.metadata: not a sharded checkpoint (or its model files are gone)",
            "pass a complete RUN/checkpoint-N (ls it: pytorch_model_fsdp_0/ holds the adapter)",
        )
    check_adapter(folder)
    _check_output(folder, out, force)
    _check_complete(folder)
    unsafe = check_checkpoint(shards)
    if unsafe is not None:
        raise FolderRefused(
            f"{unsafe.file}: {unsafe.what}; reading it would run what its pickle names",
            "export only checkpoints you wrote",
        )
    return shards


def _check_complete(folder: Path) -> None:
    """The checkpoint finished (its completion marker), and the model's files it lists still there, as long: the
    optimizer's and the RNG's may be gone (deleted to save space) without harm to the adapter."""
    from fsdp_tune.rundir.checkpoints import read_marker
    from fsdp_tune.runfiles import COMPLETE_MARKER

    marker = read_marker(folder)
    files = marker.get("files") if marker else None
    if not isinstance(files, dict):
        raise UsageError(
            f"{folder} has no readable completion marker ({COMPLETE_MARKER}): it was never finished (or is being "
            "written now)",
            "export a finished checkpoint: one with fsdp_tune_complete in it",
        )
    for rel, record in files.items():
        if not rel.startswith(f"{SHARDS}/") or ".." in Path(rel).parts:
            continue
        path = folder / rel
        size = path.stat().st_size if path.is_file() else None
        if not isinstance(record, dict) or size != record.get("size"):
            state = "is missing" if size is None else f"is {size} bytes, {record.get('size')} when written"
            raise UsageError(f"{folder}: {rel} {state} (listed in its completion marker)", "export another checkpoint")


def _check_output(folder: Path, out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out} is a file", "name a folder: -o FOLDER")
    inside = out.resolve() == folder.resolve() or folder.resolve() in out.resolve().parents
    if inside or out.resolve() == folder.parent.resolve() or _trained_into(out):
        raise UsageError(
            f"-o {out} is the checkpoint, its run or another run's folder: the adapter would be written over it",
            f"-o {folder.parent.name}-{folder.name} (a new folder)",
        )
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty; not overwritten", "pass --force, or another -o")


def _trained_into(out: Path) -> bool:
    """A run trained into `out` (its metrics, its checkpoints): an earlier export may be replaced, a run may not."""
    from fsdp_tune.rundir.checkpoints import list_checkpoints

    return (out / METRICS_NAME).exists() or bool(list_checkpoints(out))


def _step(folder: Path) -> int | None:
    name = folder.resolve().name
    return int(name.removeprefix("checkpoint-")) if name.removeprefix("checkpoint-").isdigit() else None
