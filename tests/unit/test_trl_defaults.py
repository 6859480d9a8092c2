"""Spell TRL, get TRL's defaults (issue #25.5): `--use_peft` alone is TRL's r 16 / alpha 32 / dropout 0.05 on PEFT's
default targets for the model type, not PEFT's FSDP example's r 64 / alpha 16 / dropout 0.1; one note says so."""

from __future__ import annotations

from fsdp_tune.decide.derived import derive
from fsdp_tune.decide.lora import lora_kwargs
from fsdp_tune.validate import check

LLAMA = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B"]  # a shipped reference config: model_type llama


def _lora(*flags: str):
    checked = check(None, list(flags))
    assert not checked.errors, checked.findings
    return checked, lora_kwargs(checked.config, derive(checked.config).model)


def test_use_peft_alone_takes_trls_defaults() -> None:
    checked, kwargs = _lora("--use_peft", *LLAMA)
    assert (kwargs["r"], kwargs["lora_alpha"], kwargs["lora_dropout"]) == (16, 32.0, 0.05)
    assert kwargs["target_modules"] == ["q_proj", "v_proj"]  # PEFT's default for llama
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert note.severity.value == "note" and "TRL's defaults r=16, alpha=32, dropout=0.05" in note.message
    assert str(checked.config.origin("lora.lora_r")).startswith("lora_r (TRL's default (--use_peft")


def test_what_the_user_sets_wins() -> None:
    _, kwargs = _lora("--use_peft", "--lora_r", "8", "--lora_target_modules", "all-linear", *LLAMA)
    assert (kwargs["r"], kwargs["lora_alpha"], kwargs["target_modules"]) == (8, 32.0, "all-linear")


def test_peft_examples_spelling_keeps_its_defaults() -> None:
    checked, kwargs = _lora("--use_peft_lora", "True", *LLAMA)
    assert (kwargs["r"], kwargs["lora_alpha"], kwargs["lora_dropout"]) == (64, 16.0, 0.1)
    assert len(kwargs["target_modules"]) == 7 and not [f for f in checked.findings if f.rule == "FT015"]


def test_a_model_not_on_this_machine_keeps_fsdp_tunes_targets_and_says_so() -> None:
    checked, kwargs = _lora("--use_peft", "--model_name_or_path", "acme/unknown-model")
    assert kwargs["r"] == 16 and len(kwargs["target_modules"]) == 7
    (note,) = [f for f in checked.findings if f.rule == "FT015"]
    assert "PEFT's default for its type cannot be looked up" in note.message
