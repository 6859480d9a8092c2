"""The Trainer's gradient checkpointing under transformers 5's name (`--activation_checkpointing`, its kwargs) is the
same setting as `--gradient_checkpointing`: it reaches the ranks, clashes with FSDP's as it does, and two values of it
in one place are refused (config/keys.py TRAINER_CHECKPOINTING). Before, its value was dropped without a word."""

from __future__ import annotations

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.validate import check
from tests.conftest import FIXTURES

TINY = str(FIXTURES / "tiny_lora.yaml")


def _checked(*flags: str):
    return check(TINY, ["--output_dir", "/tmp/tcn", "--fsdp_activation_checkpointing", *flags])


def test_transformers_5s_name_reaches_the_ranks_with_its_kwargs() -> None:
    checked = _checked("false", "--activation_checkpointing", "true", "--activation_checkpointing_kwargs", "{}")
    assert not checked.errors, [str(f) for f in checked.findings]
    args = decide(checked.config, Machine.cpu_only()).trainer_args
    assert args.activation_checkpointing is True and args.activation_checkpointing_kwargs == {"use_reentrant": False}
    off = decide(_checked("false").config, Machine.cpu_only()).trainer_args
    assert off.activation_checkpointing is False  # the tiny run's own: nothing recomputes


def test_it_clashes_with_fsdps_and_with_its_other_name() -> None:
    both = _checked("true", "--activation_checkpointing", "true")
    assert [(f.rule, f.key) for f in both.errors] == [("FT030", "--activation_checkpointing")]
    two = _checked("false", "--gradient_checkpointing", "true", "--activation_checkpointing", "false")
    assert [f.rule for f in two.errors] == ["FT014"]
