"""The models and adapter options users bring, decided before launch (no torch): TRL's and PEFT's flags taken
verbatim, the attention a model's class supports, what LoRA reaches on MoE models, and the LoraConfig fields
and combinations that cannot work under FSDP2, each refused (or dropped) with its rule id."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.config.lora_fields import INIT_VALUES, TRL_MODEL_CONFIG, VERDICTS, lora_fields, model_config_fields
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.validate import check
from tests.conftest import FIXTURES

CPU = Machine(cuda=False, gpus=0)
ACCELERATE_FSDP2 = str(FIXTURES / "peer-configs" / "trl-fsdp2.yaml")
LORA = ["--use_peft_lora", "True"]
MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"
GEMMA2 = "google/gemma-2-9b"


def _rules(checked, severity: str = "error") -> list[str]:
    return sorted({f.rule for f in checked.findings if f.severity.value == severity})


def test_every_loraconfig_field_has_a_verdict_and_every_modelconfig_field_a_setting() -> None:
    """A PEFT or TRL upgrade that adds a field fails here until someone says what becomes of it."""
    assert set(lora_fields()) == set(VERDICTS)
    assert set(model_config_fields()) == set(TRL_MODEL_CONFIG)
    assert {v.action for v in VERDICTS.values()} == {"pass", "refuse", "drop"}
    assert all(v.why for v in VERDICTS.values() if v.action != "pass")


def test_trl_documented_fsdp_line_is_taken_verbatim() -> None:
    """TRL's FSDP example (`accelerate launch --config_file fsdp2.yaml trl/scripts/sft.py ...`): its flags as given."""
    trl_flags = "--use_peft --lora_r 32 --lora_target_modules q_proj v_proj --load_in_4bit --dtype bfloat16"
    checked = check(ACCELERATE_FSDP2, [*trl_flags.split(), "--use_bnb_nested_quant", "--model_revision", "v1"])
    assert not checked.errors and not _rules(checked, "warning"), [str(f) for f in checked.findings]
    cfg = checked.config
    assert cfg.lora.use_peft_lora and cfg.lora.lora_r == 32 and cfg.lora.lora_target_modules == ("q_proj", "v_proj")
    assert cfg.quantization.use_4bit_quantization and cfg.quantization.use_nested_quant
    spec = decide(cfg, CPU)
    assert spec.model.dtype == "bfloat16" and spec.model.revision == "v1"
    # TRL computes 4-bit matmuls in the dtype (get_quantization_config); storage: the dtype, so FSDP shards it
    assert spec.model.quantization.bnb_4bit_compute_dtype == "bfloat16"
    assert spec.model.quantization.bnb_4bit_quant_storage == "bfloat16"
    assert spec.lora.target_modules == ["q_proj", "v_proj"] and spec.lora.revision == "v1"


@pytest.mark.parametrize(
    "flags",
    [
        ["--use_peft", "--use_peft_lora", "false"],
        ["--dtype", "bfloat16", "--torch_dtype", "float32"],
        ["--load_in_4bit", "true", "--use_4bit_quantization", "false"],
        ["--lora_modules_to_save", "lm_head", "--modules_to_save", "embed_tokens"],
    ],
)
def test_two_spellings_that_disagree_name_each_other(flags: list[str]) -> None:
    checked = check(None, [*LORA, *flags])
    found = [f for f in checked.findings if f.rule == "FT014"]
    assert found and flags[0] in found[0].message and flags[-2] in found[0].message, checked.findings


def test_two_spellings_that_agree_are_one_setting() -> None:
    assert "FT014" not in _rules(check(None, ["--use_peft", "--use_peft_lora", "true", "--lora_r", "8"]))


def test_peft_and_trl_lora_flags_reach_the_loraconfig(tmp_path) -> None:
    flags = [
        "--use_rslora",
        "--init_lora_weights",
        "gaussian",
        "--lora_target_parameters",
        "mlp.down_proj.weight",
        "--lora_modules_to_save",
        "lm_head",
        "--layers_to_transform",
        "0",
        "1",
        "--lora_target_modules",
        "q_proj",
        "v_proj",
        "--lora_dropout",
        "0",
        "--rank_pattern",
        '{"q_proj": 16}',
    ]
    checked = check(None, [*LORA, *flags])
    assert not checked.errors, checked.findings
    lora = decide(checked.config, CPU).lora.kwargs()  # LoraConfig's arguments
    assert lora["use_rslora"] is True and lora["init_lora_weights"] == "gaussian"
    assert lora["target_parameters"] == ["mlp.down_proj.weight"] and lora["modules_to_save"] == ["lm_head"]
    assert lora["layers_to_transform"] == [0, 1] and lora["rank_pattern"] == {"q_proj": 16}
    recipe = tmp_path / "r.yaml"  # the same fields as recipe keys of `lora:`
    recipe.write_text("lora:\n  use_peft_lora: true\n  use_rslora: true\n  lora_target_parameters: [a.weight]\n")
    lora = decide(check(str(recipe), []).config, CPU).lora.kwargs()
    assert lora["use_rslora"] is True and lora["target_parameters"] == ["a.weight"]


@pytest.mark.parametrize(
    "flags,rule",
    [
        (["--init_lora_weights", "pissa"], "FT065"),
        (["--init_lora_weights", "pissa_niter_4"], "FT065"),
        (["--init_lora_weights", "olora"], "FT065"),
        (["--init_lora_weights", "eva"], "FT065"),
        (["--init_lora_weights", "loftq"], "FT065"),
        (["--init_lora_weights", "mica"], "FT065"),
        (["--init_lora_weights", "orthogonal", "--lora_r", "7"], "FT065"),
        (["--init_lora_weights", "nonsense"], "FT065"),
        (["--layer_replication", "[[0, 1]]"], "FT064"),
        (["--use_qalora", "true"], "FT064"),
        (["--lora_task_type", "SEQ_CLS"], "FT064"),
        (["--inference_mode", "true"], "FT064"),
        (["--layers_to_transform", "0", "--lora_target_modules", "all-linear"], "FT064"),
        (["--lora_bias", "true", "--use_dora", "true"], "FT064"),
        (["--target_parameters", "mlp.down_proj.weight", "--lora_dropout", "0.1"], "FT066"),
        (["--target_parameters", "mlp.down_proj.weight", "--use_dora", "true", "--lora_dropout", "0"], "FT066"),
        (["--use_4bit_quantization", "true", "--use_dora", "true"], "FT068"),
    ],
)
def test_what_cannot_work_under_fsdp2_is_refused_before_launch(flags: list[str], rule: str) -> None:
    assert rule in _rules(check(None, [*LORA, *flags]))


@pytest.mark.parametrize("init", [k for k, why in INIT_VALUES.items() if why is None])
def test_initialisations_that_work_under_fsdp2_pass(init: str) -> None:
    checked = check(None, [*LORA, "--init_lora_weights", init])
    assert not checked.errors, checked.findings


@pytest.mark.parametrize("name", ["peft_version", "runtime_config", "base_model_name_or_path"])
def test_bookkeeping_fields_are_dropped_with_a_warning(name: str) -> None:
    value = {"runtime_config": '{"ephemeral_gpu_offload": true}'}.get(name, "x")
    checked = check(None, [*LORA, f"--{name}", value])
    assert "FT064" in _rules(checked, "warning") and name not in decide(checked.config, CPU).lora.kwargs()


def test_attention_is_the_models_own_choice_and_a_path_it_cannot_take_is_refused() -> None:
    """Gemma 2 has no SDPA (attention softcapping): it runs eager, and asking for sdpa is FT084."""
    assert decide(check(None, ["--model_name_or_path", GEMMA2]).config, CPU).model.attn_implementation == "eager"
    assert decide(check(None, ["--model_name_or_path", MIXTRAL]).config, CPU).model.attn_implementation == "sdpa"
    assert decide(check(None, ["--model_name_or_path", "nowhere/model"]).config, CPU).model.attn_implementation is None
    refused = check(None, ["--model_name_or_path", GEMMA2, "--attn_implementation", "sdpa"])
    assert [f for f in refused.findings if f.rule == "FT084" and "softcapping" in f.message]
    for ok in ("eager", "flex_attention"):
        assert "FT084" not in _rules(check(None, ["--model_name_or_path", GEMMA2, "--attn_implementation", ok]))


def _qwen3_moe(tmp_path) -> str:
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4}
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_experts_per_tok": 2, "hidden_size": 64}))
    return str(tmp_path)


def test_moe_experts_decide_the_dropout_and_refuse_what_peft_cannot_do(tmp_path) -> None:
    """PEFT's ParamWrapper (LoRA on fused experts, routers) takes no dropout: the default becomes 0 with a
    warning; one the user asked for, DoRA and lora_bias are refused."""
    moe = _qwen3_moe(tmp_path)
    default = check(None, [*LORA, "--model_name_or_path", moe])
    assert "FT066" in _rules(default, "warning") and not default.errors
    assert decide(default.config, CPU).lora.lora_dropout == 0.0
    dense = check(None, [*LORA, "--model_name_or_path", GEMMA2])
    assert decide(dense.config, CPU).lora.lora_dropout == 0.1
    for flags in (["--lora_dropout", "0.05"], ["--use_dora", "true"], ["--lora_bias", "true", "--lora_dropout", "0"]):
        assert "FT066" in _rules(check(None, [*LORA, "--model_name_or_path", moe, *flags]))
    half = check(None, [*LORA, "--model_name_or_path", moe, "--lora_target_modules", "q_proj", "gate_proj"])
    assert "FT066" in _rules(half)  # gate_proj and up_proj are one fused parameter


def test_mixtral_default_targets_skip_the_experts_and_all_linear_reaches_them() -> None:
    skipped = check(None, [*LORA, "--model_name_or_path", MIXTRAL, "--lora_dropout", "0"])
    assert any(f.rule == "FT066" and "not adapted" in f.message for f in skipped.findings)
    full = check(None, [*LORA, "--model_name_or_path", MIXTRAL, "--lora_target_modules", "all-linear"])
    assert not full.errors and decide(full.config, CPU).lora.lora_dropout == 0.0
    named = check(None, [*LORA, "--model_name_or_path", MIXTRAL, "--lora_target_modules", "w1", "w2", "w3"])
    assert "FT081" not in _rules(named, "warning")  # PEFT maps Mixtral's pre-fusion names onto the experts


def test_embeddings_on_tied_models(tmp_path) -> None:
    """Gemma 2 ties its embeddings: training a copy needs ensure_weight_tying; trainable tokens cannot be sharded."""
    tied = [*LORA, "--model_name_or_path", GEMMA2]
    assert "FT067" in _rules(check(None, [*tied, "--modules_to_save", "lm_head"]))
    ok = check(None, [*tied, "--modules_to_save", "lm_head", "--ensure_weight_tying", "true"])
    assert not ok.errors and "FT067" in _rules(ok, "note")  # the vocabulary matrix trains: said
    assert "FT067" in _rules(check(None, [*tied, "--trainable_token_indices", "3", "4"]))
    untied = check(
        None, [*LORA, "--model_name_or_path", MIXTRAL, "--trainable_token_indices", "3", "--lora_dropout", "0"]
    )
    assert "FT067" not in _rules(untied)


def test_peft_fields_survive_the_recipe_writer() -> None:
    """The run manifest and `convert --to recipe` write the LoraConfig fields back into `lora:`."""
    from fsdp_tune.config.writers import to_recipe

    checked = check(None, [*LORA, "--use_rslora", "--layers_to_transform", "0", "1"])
    assert to_recipe(checked.config)["lora"]["layers_to_transform"] == [0, 1]
