"""Settings for vision-language models (config/model_kinds.py), checked against the model's config.json where it is
on this machine. What depends on the data (images in it, a text-only model given images, what TRL refuses for
vision data) is pre-flight's (preflight/vision.py)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.model_kinds import KINDS, family_of, kind_row
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning


def _config(d: Derived) -> dict | None:
    """The model's config.json as the door found it (decide/derived.py `Derived.model`)."""
    return d.model.config


@rule("FT125", "model", "a vision-language model must be a family fsdp-tune knows", decided=True)
def known_family(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    config = _config(d)
    kind = kind_row(config)
    if not kind.families or family_of(config) is not None:
        return
    known = ", ".join(f"{row.model_type} ({row.title})" for row in kind.families.values())
    yield error(
        cfg,
        "FT125",
        "model.model_name_or_path",
        f"{cfg.model.model_name_or_path} is a {kind.title} ({config.get('model_type')}) of a family "
        f"fsdp-tune has no row for: which modules are its vision tower, projector and language model (FSDP units, "
        f"LoRA targets) is not known. Known: {known}",
        "add its row to fsdp_tune/config/model_kinds.py FAMILIES, or train a known family",
    )


@rule("FT126", "model", "vision-language models train on SFT data", decided=True)
def vision_method(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if row_of(cfg.run.method).data == "sft" or not kind_row(_config(d)).images:
        return
    yield error(
        cfg,
        "FT126",
        "run.method",
        f"{cfg.run.method} on a vision-language model: fsdp-tune prepares images for SFT's data only (preference "
        "data carries no images here)",
        "--method sft, or a language model for preference training",
    )


@rule("FT127", "model", "a vision-language model keeps its processor's chat template", decided=True)
def vision_template(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if cfg.data.chat_template_format == "none" or not kind_row(_config(d)).images:
        return
    yield error(
        cfg,
        "FT127",
        "data.chat_template_format",
        f"--chat_template_format {cfg.data.chat_template_format} on a vision-language model: that template writes "
        "each message's content as text and has no place for an image; the processor's own template puts each "
        "image's token where the model was trained to read it",
        "--chat_template_format none (the processor's template)",
    )


@rule("FT128", "model", "vision settings on a model without a vision tower have no effect", decided=True)
def freeze_without_vision(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    config = _config(d)
    kind = kind_row(config)
    others = [s for row in KINDS.values() if row is not kind for s in row.settings if s not in kind.settings]
    if not others:
        return
    name = cfg.model.model_name_or_path or "the model"
    why = (
        f"{name} has no vision tower ({config.get('model_type')})"
        if config is not None
        else f"{name}'s config.json is not on this machine, so it is planned as a language model"
    )
    for path in others:
        if cfg.is_set(path):
            yield warning(
                cfg,
                "FT128",
                path,
                f"{why}: {path.split('.')[1]} has no effect (dropped)",
                f"drop --{path.split('.')[1]}",
            )


@rule("FT129", "model", "a vision-language run keeps every column for its collator", decided=True)
def unused_columns(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if not cfg.training.get("remove_unused_columns") or not cfg.training.is_set("remove_unused_columns"):
        return
    if not kind_row(_config(d)).images:
        return
    yield warning(
        cfg,
        "FT129",
        "training.remove_unused_columns",
        "--remove_unused_columns true on a vision-language model: the Trainer would drop each row's images before "
        "the collator sees them; fsdp-tune passes false (dropped)",
        "drop --remove_unused_columns",
    )
