"""A method's own checks of its settings are its entry's (the row's `checks`: methods/dpo.py, methods/kto.py): the
rules layer registers FT111 and FT113 once each and only turns what the row's checks refuse into findings, so a row
without checks gets none of them, and a row's check is heard under its id whatever the method."""

from __future__ import annotations

import dataclasses

import pytest

from fsdp_tune.config.methods import ROWS, Refused, fields_of
from fsdp_tune.errors import Severity
from fsdp_tune.methods import dpo, kto
from fsdp_tune.rules.method import ROW_RULES
from fsdp_tune.validate import check

LORA = ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--use_peft_lora", "--output_dir", "/tmp/m"]

# each branch of DPO's and KTO's checks, and the (rule, key) it is refused under
REFUSED = [
    ("dpo", ["--loss_type", "exo_pair"], "FT111", "--loss_type"),
    ("dpo", ["--loss_type", "robust", "--label_smoothing", "0.5"], "FT111", "--label_smoothing"),
    ("dpo", ["--loss_type", "sigmoid", "sft", "--loss_weights", "1.0"], "FT111", "--loss_weights"),
    ("dpo", ["--loss_type", "apo_zero", "--f_divergence_type", "js_divergence"], "FT111", "--f_divergence_type"),
    ("dpo", ["--loss_type", "aot", "--use_weighting", "true"], "FT111", "--use_weighting"),
    ("dpo", ["--ld_alpha", "2"], "FT111", "--ld_alpha"),
    ("kto", ["--per_device_train_batch_size", "1"], "FT113", "--per_device_train_batch_size"),
    ("kto", ["--train_sampling_strategy", "random"], "FT113", "--train_sampling_strategy"),
]


def _found(method: str, flags: list[str], rule: str) -> list:
    return [f for f in check(None, [*LORA, "--method", method, *flags]).findings if f.rule == rule]


@pytest.mark.parametrize("method, flags, rule, key", REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else x)
def test_the_rows_checks_are_what_refuses(
    monkeypatch: pytest.MonkeyPatch, method: str, flags: list[str], rule: str, key: str
) -> None:
    assert [f.key for f in _found(method, flags, rule)] == [key]
    monkeypatch.setitem(ROWS, method, dataclasses.replace(ROWS[method], checks=()))
    assert _found(method, flags, rule) == []  # no body for the id left in the rules layer


def test_a_rows_check_is_heard_under_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule dispatches to whatever the method's row holds, the default method's included, and cites the key as
    the user wrote it."""

    def fake(settings):
        yield Refused("FT113", "warning", "training.learning_rate", f"rate {settings.get('learning_rate')}", "fix")

    monkeypatch.setitem(ROWS, "sft", dataclasses.replace(ROWS["sft"], checks=(fake,)))
    [found] = _found("sft", ["--learning_rate", "0.5"], "FT113")
    assert (found.severity, found.key, found.source, found.message, found.hint) == (
        Severity.WARNING,
        "--learning_rate",
        "command line",
        "rate 0.5",
        "fix",
    )


def test_a_check_under_an_unregistered_id_is_our_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    def stray(settings):
        yield Refused("FT999", "error", "training.learning_rate", "m", "h")

    assert "FT999" not in ROW_RULES
    monkeypatch.setitem(ROWS, "sft", dataclasses.replace(ROWS["sft"], checks=(stray,)))
    with pytest.raises(RuntimeError, match="FT999"):
        check(None, LORA)


def test_every_method_with_dpos_loss_settings_has_dpos_check() -> None:
    """FT111 is the check of every method whose TRL config has DPOConfig's loss settings (read from the installed
    TRL's fields, as before the check moved into the entry), and of no other."""
    for name, row in ROWS.items():
        takes = "f_divergence_type" in fields_of(name)
        assert (dpo.loss_parameters in row.checks) is takes, name
    assert kto.kl_batches in ROWS["kto"].checks
