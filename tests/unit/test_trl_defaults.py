"""Spell TRL, get TRL's defaults (issue #25.5, #48): `--use_peft` alone is TRL's r 16 / alpha 32 / dropout 0.05 on
PEFT's default targets for the model type, not PEFT's FSDP example's r 64 / alpha 16 / dropout 0.1; the same for
`use_peft: true` in a recipe or TRL's config file; one note says which defaults were taken and from where, for
either name of the switch."""

from __future__ import annotations

import pytest

from fsdp_tune.decide.derived import derive
from fsdp_tune.decide.lora import lora_spec
from fsdp_tune.validate import check
from tests.conftest import FIXTURES

LLAMA = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B"]  # a shipped reference config: model_type llama


def _lora(*flags: str, config: str | None = None):
    checked = check(config, list(flags))
    assert not checked.errors, checked.findings
    return checked, lora_spec(checked.config, derive(checked.config).model).kwargs()


def test_use_peft_alone_takes_trls_defaults() -> None:
    checked, kwargs = _lora("--use_peft", *LLAMA)
    assert (kwargs["r"], kwargs["lora_alpha"], kwargs["lora_dropout"]) == (16, 32.0, 0.05)
    assert kwargs["target_modules"] == ["q_proj", "v_proj"]  # PEFT's default for llama
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert (
        note.severity.value == "note"
        and "TRL's defaults (its ModelConfig) r=16, alpha=32, dropout=0.05" in note.message
    )
    assert "`use_peft_lora` would take PEFT's FSDP example's (r=64" in note.message
    assert str(checked.config.origin("lora.lora_r")).startswith("lora_r (TRL's default (--use_peft")


def test_what_the_user_sets_wins() -> None:
    _, kwargs = _lora("--use_peft", "--lora_r", "8", "--lora_target_modules", "all-linear", *LLAMA)
    assert (kwargs["r"], kwargs["lora_alpha"], kwargs["target_modules"]) == (8, 32.0, "all-linear")


def test_peft_examples_spelling_keeps_its_defaults_and_says_so() -> None:
    checked, kwargs = _lora("--use_peft_lora", "True", "--lora_r", "8", *LLAMA)
    assert (kwargs["r"], kwargs["lora_alpha"], kwargs["lora_dropout"]) == (8, 16.0, 0.1)
    assert len(kwargs["target_modules"]) == 7
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert (note.key, note.source) == ("--use_peft_lora", "command line")
    assert (
        "PEFT's FSDP example's defaults (fsdp-tune's own) alpha=16, dropout=0.1, target_modules=q_proj" in note.message
    )
    assert "r=64" not in note.message.split(";")[0]  # r was set: only what took a default is named


def test_nothing_left_unset_needs_no_note() -> None:
    flags = ("--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0", "--lora_target_modules", "q_proj")
    for switch in ("--use_peft", "--use_peft_lora"):
        checked, _ = _lora(switch, *flags, *LLAMA)
        assert not [f for f in checked.findings if f.rule == "FT015"]


@pytest.mark.parametrize(
    "text",
    [
        "lora:\n  use_peft: true\n",  # a recipe's lora: section, TRL's name
        "training:\n  use_peft: true\n",  # a recipe's training: section takes every flag
        "use_peft: true\nlearning_rate: 1.0e-4\n",  # TRL's own config file
    ],
)
def test_use_peft_in_a_file_gets_what_the_flag_gets(text: str, tmp_path) -> None:
    """One answer for `use_peft` wherever it is written: TRL's defaults, and the note naming the file's line."""
    path = tmp_path / "run.yaml"
    path.write_text(text)
    checked, kwargs = _lora(*LLAMA, config=str(path))
    _, by_flag = _lora("--use_peft", *LLAMA)
    assert kwargs == by_flag and kwargs["r"] == 16 and kwargs["target_modules"] == ["q_proj", "v_proj"]
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert note.source.startswith(f"{path}:") and "switched on by `use_peft`: " in note.message
    assert "TRL's defaults (its ModelConfig) r=16" in note.message
    assert checked.config.origin("lora.lora_r").source.startswith(f"TRL's default ({note.key}, {path}:")


def test_a_vision_model_on_this_machine_is_not_said_to_be_missing() -> None:
    """PEFT has no default targets for qwen2_vl: the note says that, not that its config.json is not here."""
    checked, _ = _lora("--use_peft", "--model_name_or_path", str(FIXTURES / "vision" / "qwen2_vl"))
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert "not on this machine" not in note.message
    assert "PEFT has no default target modules for model type qwen2_vl" in note.message


def test_a_model_not_on_this_machine_keeps_fsdp_tunes_targets_and_says_so() -> None:
    checked, kwargs = _lora("--use_peft", "--model_name_or_path", "acme/unknown-model")
    assert kwargs["r"] == 16 and len(kwargs["target_modules"]) == 7
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert "PEFT's default for its type cannot be looked up" in note.message
