"""A vision-language model's decisions, made once on the launcher from its config.json and its family's row
(config/model_kinds.py): no `if vision` elsewhere, each decision below is read where the rank spec is made.

    units    FSDP2 units for both towers: the language model's decoder layers, the vision tower's blocks, and the
             projector alone (what trains in a unit then has one dtype: the projector trained whole never shares a
             unit with LoRA's tensors or with the frozen tower)
    LoRA     the language model's linear layers by default (--lora_target_modules names them); the tower's and the
             projector's are excluded (PEFT's exclude_modules), unless --freeze_vision_tower false puts LoRA on the
             tower's linear layers too; --freeze_multi_modal_projector false trains the projector whole
             (modules_to_save), as LLaMA-Factory does
    trainer  the rows keep their image column to the collator (remove_unused_columns false)
    guard    every rank runs the vision tower every step (VisionSpec.guard)

Pure: reads the model's config.json as the door found it (sources/model.py ModelFacts, in `Derived.model`); no torch.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from fsdp_tune.config.model_kinds import VisionFamily, family_of, kind_of, kind_row
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import LoraSpec, VisionSpec
from fsdp_tune.sources import model as model_source
from fsdp_tune.sources.model import ModelFacts


def model_kind(model: ModelFacts) -> str:
    """The model's kind from its config.json; a model whose config is not on this machine is taken as a language
    model (a rank that finds a vision tower says so: worker/loading/build.py)."""
    return kind_of(model.config)


def vision_spec(cfg: RunConfig, model: ModelFacts) -> VisionSpec | None:
    row = family_of(model.config)
    if row is None:
        return None
    m = cfg.model
    return VisionSpec(
        family=row.model_type,
        tower=row.tower,
        projector=row.projector,
        train_tower=not m.freeze_vision_tower,
        train_projector=not m.freeze_multi_modal_projector,
    )


def unit_classes(row: VisionFamily, config: dict) -> tuple[str, ...]:
    """The classes made FSDP units: the language model's decoder layer, the tower's block, the projector."""
    language = row.language_layers
    if language is None:
        text_type = str((config.get("text_config") or {}).get("model_type") or "")
        src = model_source._read(text_type) if text_type else None  # noqa: SLF001 - the cached modeling-file read
        language = src.no_split_modules[0] if src and src.no_split_modules else None
    tower = row.tower_layers
    if not isinstance(tower, str):
        tower = tower.get(str((config.get("vision_config") or {}).get("model_type") or ""))
    return tuple(c for c in (language, tower, row.projector_class) if c)


def layer_classes(cfg: RunConfig, model: ModelFacts) -> tuple[str, ...]:
    """TRANSFORMER_BASED_WRAP's classes: the user's (--fsdp_transformer_layer_cls_to_wrap), else a vision-language
    family's units, else none (accelerate takes the model's _no_split_modules)."""
    named = tuple(cfg.fsdp.transformer_layer_cls_to_wrap)
    if named or cfg.fsdp.auto_wrap_policy != "TRANSFORMER_BASED_WRAP":
        return named
    row, config = family_of(model.config), model.config
    return unit_classes(row, config) if row is not None and config is not None else ()


def scoped_lora(cfg: RunConfig, model: ModelFacts, lora: LoraSpec) -> LoraSpec:
    """LoraConfig's fields for a vision-language model: the frozen parts excluded, the tower's linear layers
    targeted when it trains, the projector in modules_to_save when it trains whole (see the module's docstring)."""
    row = family_of(model.config)
    if row is None:
        return lora
    m = cfg.model
    frozen = [row.projector] + ([row.tower] if m.freeze_vision_tower else [])
    targets = lora.target_modules
    if not m.freeze_vision_tower and targets != "all-linear":
        targets = list(dict.fromkeys([*targets, *row.tower_linears]))
    saved = lora.modules_to_save
    if not m.freeze_multi_modal_projector:
        saved = list(dict.fromkeys([*(saved or []), row.projector]))
    return replace(
        lora, exclude_modules=_excluded(frozen, lora.exclude_modules), target_modules=targets, modules_to_save=saved
    )


def _excluded(paths: list[str], given: Any) -> str:
    """PEFT's exclude_modules as one regex (full match on a module's name): the frozen parts and all under them,
    and what the user excluded (a list: by name or suffix, as PEFT reads a list; a string: the user's regex)."""
    parts = [rf"(?:.*\.)?{re.escape(p)}(?:\..*)?" for p in paths]
    if isinstance(given, str):
        parts.append(given)
    elif given:
        parts += [rf"(?:.*\.)?{re.escape(str(g))}" for g in given]
    return "|".join(f"(?:{p})" for p in parts)


def keeps_columns(model: ModelFacts) -> bool:
    """A vision-language model's trainer keeps every column (remove_unused_columns false): each row's images reach
    the collator (the Trainer would otherwise drop every column the model's forward does not name)."""
    return bool(kind_row(model.config).images)


__all__ = ["keeps_columns", "layer_classes", "model_kind", "scoped_lora", "vision_spec"]
