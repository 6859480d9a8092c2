"""Values checked before launch: every choice-valued SFTConfig field against the installed libraries' own enums
(generated into training_fields.json), with the closest valid value; no NaN/inf in a float field; intervals
and the collective timeout in range. Each of these used to pass validation and fail on the ranks."""

from __future__ import annotations

import pytest

from fsdp_tune.config.schema import training_fields
from fsdp_tune.validate import check


def _errors(*argv: str) -> dict[str, tuple[str, str, str]]:
    """key -> (rule, message, hint) of every error."""
    checked = check(None, list(argv))
    return {f.key: (f.rule, f.message, f.hint) for f in checked.errors}


@pytest.mark.parametrize(
    "flag,typo,closest",
    [
        ("--lr_scheduler_type", "cosin", "cosine"),
        ("--optim", "adamw_torch_fusd", "adamw_torch_fused"),
        ("--eval_strategy", "step", "steps"),
        ("--save_strategy", "epochs", "epoch"),
        ("--logging_strategy", "stpes", "steps"),
        ("--hub_strategy", "every-save", "every_save"),
        ("--report_to", "tensorbord", "tensorboard"),
        ("--attn_implementation", "sdpaa", "sdpa"),
        ("--ddp_backend", "ncl", "nccl"),
        ("--log_level", "warn", "warning"),
        ("--packing_strategy", "bfdd", "bfd"),
    ],
)
def test_a_typo_in_a_choice_is_refused_with_the_closest_value(flag: str, typo: str, closest: str) -> None:
    rule, message, hint = _errors(flag, typo)[flag]
    assert rule == "FT010" and repr(typo) in message, message
    assert hint.startswith(f"{flag} {closest} (the closest)"), hint


def test_valid_choices_pass_and_case_is_forgiven() -> None:
    checked = check(
        None,
        ["--lr_scheduler_type", "Cosine", "--optim", "adamw_torch", "--report_to", "tensorboard", "wandb"]
        + ["--attn_implementation", "kernels-community/flash-attn3", "--eval_strategy", "no"],
    )
    assert not checked.errors, checked.errors
    args = checked.config.training.args
    assert args["lr_scheduler_type"] == "cosine" and args["report_to"] == ("tensorboard", "wandb")
    assert checked.config.model.attn_implementation == "kernels-community/flash-attn3"  # a Hub kernel, as named


def test_every_enum_field_of_sftconfig_has_its_choices() -> None:
    """The table carries the values of the fields whose type is an enum (generated, not typed by hand)."""
    have = {name for name, spec in training_fields().items() if spec.get("choices")}
    wanted = {"lr_scheduler_type", "optim", "eval_strategy", "save_strategy", "logging_strategy", "hub_strategy"}
    wanted |= {"report_to", "debug", "log_level", "ddp_backend", "truncation_mode", "loss_type", "packing_strategy"}
    assert wanted <= have, wanted - have
    for name in have:  # the default is always one of them
        default = training_fields()[name]["default"]
        if isinstance(default, str) and default:
            assert default in training_fields()[name]["choices"], name


FLOATS = ("--learning_rate", "--lora_alpha", "--weight_decay", "--num_train_epochs", "--max_grad_norm")


@pytest.mark.parametrize("flag", FLOATS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_nan_and_inf_are_refused_in_every_float_field(flag: str, value: str) -> None:
    rule, message, _ = _errors(flag, value)[flag]
    assert rule == "FT010" and "finite" in message, message


def test_nan_from_a_yaml_file_is_refused_too(tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("training:\n  learning_rate: .nan\nlora:\n  lora_alpha: .inf\n")
    errors = {f.key: f for f in check(str(recipe), []).errors}
    assert {"training.learning_rate", "lora.lora_alpha"} <= set(errors), errors
    assert all("finite" in errors[k].message for k in ("training.learning_rate", "lora.lora_alpha"))


@pytest.mark.parametrize(
    "argv,key",
    [
        (["--logging_steps", "0"], "--logging_steps"),
        (["--logging_steps", "-3"], "--logging_steps"),
        (["--save_strategy", "steps", "--save_steps", "0"], "--save_steps"),
        (["--eval_strategy", "steps", "--eval_steps", "-1"], "--eval_steps"),
        (["--save_strategy", "steps", "--save_steps", "2.5"], "--save_steps"),
        (["--ddp_timeout", "-5"], "--ddp_timeout"),
        (["--ddp_timeout", "0"], "--ddp_timeout"),  # was silently 1800
    ],
)
def test_intervals_and_the_timeout_out_of_range_are_refused(argv: list[str], key: str) -> None:
    assert _errors(*argv)[key][0] == "FT072"


def test_intervals_in_range_pass() -> None:
    argv = ["--logging_steps", "0.1", "--save_strategy", "steps", "--save_steps", "2", "--ddp_timeout", "60"]
    assert not check(None, [*argv, "--logging_strategy", "steps"]).errors
    assert not check(None, ["--logging_strategy", "no", "--logging_steps", "0"]).errors  # not read then
