"""The LoraConfig every rank builds from the rank spec (decide/lora.py decided it; LoraSpec.kwargs names its
arguments): sharded loading applies it itself, the transformers path hands it to the trainer."""

from __future__ import annotations

from peft import LoraConfig

from fsdp_tune.decide.spec import RankSpec


def lora_config(spec: RankSpec) -> LoraConfig | None:
    return LoraConfig(**spec.lora.kwargs()) if spec.lora is not None else None
