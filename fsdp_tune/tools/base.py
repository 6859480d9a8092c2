"""The base model behind a run's adapter, as the after-run tools (chat, merge) load it."""

from __future__ import annotations

import json
from pathlib import Path

from fsdp_tune.errors import UsageError
from fsdp_tune.runfiles import ADAPTER_CONFIG, ADAPTER_WEIGHTS


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
            "pass the run's output dir (its final adapter), or checkpoint with --fsdp_state_dict_type FULL_STATE_DICT",
        )


def recorded_base(adapter_dir: Path) -> str:
    """The base model the adapter's config records (PEFT's base_model_name_or_path)."""
    recorded = json.loads((adapter_dir / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not recorded:
        raise UsageError("the adapter does not record its base model", "pass --base MODEL")
    return recorded


def resize_as_trained(model, tokenizer) -> None:
    """A vocabulary the run grew for its chat template: the base resized as the run resized it."""
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8, mean_resizing=False)


def is_reward_adapter(adapter_dir: Path) -> bool:
    """A reward model's adapter (PEFT task_type SEQ_CLS: LoRA and the trained score head)."""
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    return str(config.get("task_type") or "").upper() == "SEQ_CLS"


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
