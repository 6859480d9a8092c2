"""The hint of an unknown flag or key: another tool's name for a setting points at ours (config/suggest.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.names import flag_table
from fsdp_tune.config.suggest import OTHER_NAMES, did_you_mean
from tests.conftest import REPO


def test_every_other_name_is_unknown_here_and_points_at_a_flag() -> None:
    flags = flag_table()
    assert not [n for n in OTHER_NAMES if n in flags], "a name that is a flag never reaches the hint"
    assert not [t for t, _ in OTHER_NAMES.values() if t not in flags], "each target must be a flag"


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("model", "model_name_or_path"),  # spelling alone said --delta
        ("lr", "learning_rate"),  # --r
        ("batch_size", "per_device_train_batch_size"),  # --tp_size
        ("lora_rank", "lora_r"),  # --local_rank
        ("micro_batch_size", "per_device_train_batch_size"),
        ("cutoff_len", "max_seq_len"),
        ("Base-Model", "model_name_or_path"),
    ],
)
def test_another_tools_name_gets_our_flag(typed: str, meant: str) -> None:
    assert did_you_mean(typed, flag_table(), prefix="--").startswith(f"did you mean `--{meant}`? (`"), typed


def test_spelling_still_suggests_and_a_section_without_the_target_gets_no_other_name() -> None:
    assert did_you_mean("learning_rat", flag_table(), prefix="--") == "did you mean `--learning_rate`?"
    assert did_you_mean("model", ["model_type", "dtype"]) == "did you mean `model_type`?"  # the target not a key here


def test_the_cli_names_the_flag_and_whose_name_it_was() -> None:
    demo = str(REPO / "configs" / "demo_cpu.yaml")
    result = CliRunner().invoke(app, ["validate-config", "--config", demo, "--lr", "1e-4", "--epochs", "2"])
    assert result.exit_code == 2
    assert "hint: did you mean `--learning_rate`? (`lr` is torchtune's name)" in result.output
    assert "hint: did you mean `--num_train_epochs`? (`epochs` is torchtune's name)" in result.output


def test_flags_lists_our_flag_for_another_tools_name() -> None:
    result = CliRunner().invoke(app, ["flags", "micro_batch_size"])
    assert result.exit_code == 0, result.output  # was: no flag matches
    assert "--per_device_train_batch_size" in result.output and "(micro_batch_size is axolotl's name)" in result.output
    lr = CliRunner().invoke(app, ["flags", "lr"]).output
    assert "--learning_rate" in lr and "--lr_scheduler_type" in lr  # the name's own matches stay
