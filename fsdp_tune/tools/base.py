"""The base model behind a run's adapter, as the after-run tools (chat, merge) load it."""

from __future__ import annotations

from pathlib import Path

from fsdp_tune.config.folders import FolderRefused, read_json
from fsdp_tune.errors import UsageError
from fsdp_tune.runfiles import ADAPTER_CONFIG, ADAPTER_WEIGHTS, MANIFEST_NAME


def check_adapter_folder(folder: Path, what: str) -> None:
    """A PEFT adapter folder (its config and its weights), else a UsageError that says what the folder is: a
    sharded checkpoint holds PEFT's adapter_config.json but keeps its tensors inside the FSDP shards."""
    if not (folder / ADAPTER_CONFIG).exists():
        raise UsageError(
            f"{folder} has no {ADAPTER_CONFIG}: not {what}",
            "pass the output dir of a finished run (or one of its checkpoints with a FULL adapter)",
        )
    if not (folder / ADAPTER_WEIGHTS).exists():
        raise UsageError(
            f"{folder} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}: a sharded checkpoint keeps its adapter inside "
            "its FSDP shards, not as a PEFT adapter",
            f"fsdp-tune export {folder} -o {folder.parent.name}-{folder.name} (then pass that folder), or the run's "
            "output dir (its final adapter)",
        )


def recorded_base(adapter_dir: Path) -> str:
    """The base model the adapter's config records (PEFT's base_model_name_or_path)."""
    config = read_json(adapter_dir / ADAPTER_CONFIG)
    recorded = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not recorded:
        raise UsageError("the adapter does not record its base model", "pass --base MODEL")
    return recorded


def resize_as_trained(model, tokenizer) -> None:
    """A vocabulary the run grew for its chat template: the base resized as the run resized it."""
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8, mean_resizing=False)


def is_reward_adapter(adapter_dir: Path) -> bool:
    """A reward model's adapter (PEFT task_type SEQ_CLS: LoRA and the trained score head)."""
    config = read_json(adapter_dir / ADAPTER_CONFIG)
    return isinstance(config, dict) and str(config.get("task_type") or "").upper() == "SEQ_CLS"


def model_class(adapter_dir: Path, base: str | None = None):
    """(the transformers class the adapter's base loads as, its extra from_pretrained arguments): a sequence
    classifier with one score for a reward model's adapter, else its kind's (config/model_kinds.py: a causal LM,
    or an image-text-to-text model for a vision-language base)."""
    import transformers
    from transformers import AutoModelForSequenceClassification

    from fsdp_tune.config.model_kinds import KINDS
    from fsdp_tune.tools.vision import kind_of_base

    if is_reward_adapter(adapter_dir):
        return AutoModelForSequenceClassification, {"num_labels": 1}
    kind = kind_of_base(base or recorded_base(adapter_dir))
    return getattr(transformers, KINDS[kind].auto_class), {}


def locate(name: str, run_dir: Path | None = None, given: bool = False) -> str:
    """The folder the base model `name` loads from on this machine, found without the network: `--base` as the user
    gave it (`given`), else what the run recorded: its manifest's absolute path for a local folder, the name under
    the run's recorded working folder (a run from before the absolute record), the name from here, or a Hub id's
    snapshot in the Hub cache. A base that is none of these is refused at once (exit 2), where transformers would
    retry the Hub for minutes and fail."""
    from fsdp_tune.sources.model import local_folder

    path = Path(name).expanduser()
    if given and path.is_dir():
        return str(path)
    record = _manifest(run_dir) if run_dir is not None else {}
    base = record.get("base_model") if isinstance(record.get("base_model"), dict) else {}
    cwd = record.get("cwd")
    for candidate in (
        base.get("path") if base.get("name") == name or base.get("path") == name else None,
        str(Path(cwd) / path) if isinstance(cwd, str) and not path.is_absolute() else None,
        str(path),
    ):
        if candidate and Path(candidate).is_dir():
            return candidate
    cached = local_folder(name)
    if cached is not None:
        return str(cached)
    was_folder = base.get("path") or path.is_absolute() or name.startswith(".")
    raise FolderRefused(*_missing(name, run_dir, base.get("path"), cwd, bool(was_folder)))


def _missing(name: str, run_dir: Path | None, recorded: str | None, cwd, was_folder: bool) -> tuple[str, str]:
    if was_folder:
        where = recorded or name
        return f"the base model {name} (the folder {where}) is not on this machine", "pass --base FOLDER"
    if run_dir is not None and not recorded and isinstance(name, str) and "/" in name and cwd is None:
        return (
            f"the base model {name}: not a folder from here, not in the Hugging Face cache, and {run_dir} does not "
            "record where it was trained (a relative folder, or a Hub id)",
            f"pass --base FOLDER (the model the run trained on), or hf download {name}",
        )
    return f"the base model {name} is not on this machine (no such folder, not in the Hugging Face cache)", (
        f"hf download {name} (then run again), or pass --base FOLDER"
    )


def _manifest(run_dir: Path) -> dict:
    path = run_dir / MANIFEST_NAME
    try:
        data = read_json(path) if path.is_file() else {}
    except FolderRefused:
        return {}
    return data if isinstance(data, dict) else {}
