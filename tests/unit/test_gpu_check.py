"""The rank side's spelling of the trainer arguments for the transformers on the lent GPU machine (issue #21's
GPU check, rehearsed on CPU with transformers 5.17)."""

from __future__ import annotations

import dataclasses

import pytest


@dataclasses.dataclass
class _Config517:  # TrainingArguments' checkpointing fields in transformers 5.17
    output_dir: str = ""
    gradient_checkpointing: bool = False
    gradient_checkpointing_kwargs: dict | None = None


@dataclasses.dataclass
class _Config524:
    output_dir: str = ""
    activation_checkpointing: bool = False
    activation_checkpointing_kwargs: dict | None = None


def test_trainer_arguments_in_the_installed_transformers_spelling() -> None:
    """The spec speaks transformers 5.24 (activation_checkpointing); the lent machine's 5.17 calls it
    gradient_checkpointing: SFTConfig(activation_checkpointing=...) was a TypeError there (the CPU rehearsal)."""
    from fsdp_tune.worker.trainer import installed_names

    spec_args = {"output_dir": "x", "activation_checkpointing": True, "activation_checkpointing_kwargs": {"a": 1}}
    assert installed_names(dict(spec_args), _Config524) == spec_args
    old = installed_names(dict(spec_args), _Config517)
    assert old == {"output_dir": "x", "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"a": 1}}
    _Config517(**old)
    with pytest.raises(TypeError, match="takes no packing"):
        installed_names({"output_dir": "x", "packing": True}, _Config524)
