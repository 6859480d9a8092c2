"""Training methods on the launcher (no torch): `method:` in a recipe and --method, each method's TRL config fields
as flags (read from training_fields.json) and what reaches the rank spec, a starting adapter's shape taken from it
(--adapter), DPO/KTO's default recompute, the plan's and the summary's lines, and chat on a reward model."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.lora_fields import LoraSpec
from fsdp_tune.config.methods import fields_of, methods_taking
from fsdp_tune.errors import Severity
from fsdp_tune.output.run import describe_launch, format_summary
from fsdp_tune.summary import RankMemory, RunSummary
from fsdp_tune.typed import to_plain
from fsdp_tune.validate import check
from tests.conftest import FIXTURES, spec_for

BASE = ["--config", str(FIXTURES / "tiny_lora.yaml")]
LORA = ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--use_peft_lora", "--output_dir", "/tmp/m"]


def test_each_method_has_its_trl_configs_fields() -> None:
    assert fields_of("dpo")["learning_rate"]["default"] == 1e-6 and "packing" not in fields_of("dpo")
    assert fields_of("dpo")["loss_type"]["kind"] == "list" and "sppo_hard" in fields_of("dpo")["loss_type"]["choices"]
    assert fields_of("kto")["train_sampling_strategy"]["default"] == "sequential"
    assert "loss_type" not in fields_of("reward") and fields_of("sft")["loss_type"]["kind"] == "str"
    assert methods_taking("beta") == ("dpo", "kto", "grpo", "rloo") and methods_taking("desirable_weight") == ("kto",)
    grpo = fields_of("grpo")
    assert "max_length" not in grpo and grpo["num_generations"] == {"kind": "int", "default": 8}
    assert set(grpo["loss_type"]["choices"]) >= {"grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo"}
    rloo = fields_of("rloo")  # RLOOConfig: GRPO's generation settings, its own defaults, its loss without a type
    assert rloo["num_generations"] == {"kind": "int", "default": 2} and rloo["beta"]["default"] == 0.05
    assert "loss_type" not in rloo and "normalize_advantages" in rloo and "max_completion_length" in rloo
    assert grpo["vllm_mode"]["choices"] == ["colocate", "server"] and grpo["scale_rewards"]["choices"] == [
        "batch",
        "group",
        "none",
    ]


def test_the_method_reaches_the_spec_and_its_config_gets_only_its_fields(tmp_path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text((FIXTURES / "tiny_lora.yaml").read_text() + "method: dpo\n")
    checked = check(str(recipe), ["--loss_type", "sigmoid", "sft", "--loss_weights", "1", "0.5"])
    assert not checked.errors and checked.config.run.method == "dpo"
    assert checked.config.origin("run.method").source == f"{recipe}:36"
    spec = spec_for(*LORA, "--method", "dpo", "--loss_type", "sigmoid", "sft", "--loss_weights", "1", "0.5")
    args = spec.trainer_args.kwargs()
    assert spec.method.name == "dpo" and args["loss_type"] == ["sigmoid", "sft"] and args["loss_weights"] == [1.0, 0.5]
    assert "packing" not in args and "dataset_text_field" not in args and args["max_length"] == 2048
    assert set(args) <= set(fields_of("dpo"))
    assert spec.lora.task_type == "CAUSAL_LM" and spec.loading.path == "sharded"
    reward = spec_for(*LORA, "--method", "reward")
    assert reward.lora.task_type == "SEQ_CLS" and reward.loading.path == "transformers"
    assert "score head" in reward.loading.why and "loss_type" not in reward.trainer_args.kwargs()
    assert spec_for(*LORA).method.name == "sft" and "packing" in spec_for(*LORA).trainer_args.kwargs()


def test_dpo_and_kto_recompute_with_fsdp_activation_checkpointing_by_default() -> None:
    checked = check(None, [*LORA, "--method", "dpo"])
    assert checked.config.fsdp.activation_checkpointing  # TRL's default gradient_checkpointing, as FSDP's
    note = [f for f in checked.findings if f.rule == "FT116"]
    assert len(note) == 1 and note[0].severity is Severity.NOTE
    assert spec_for(*LORA, "--method", "dpo").checkpointing == "fsdp"
    assert spec_for(*LORA, "--method", "dpo", "--gradient_checkpointing", "false").checkpointing == "off"
    assert spec_for(*LORA, "--method", "reward").checkpointing == "gradient"  # no reference forward to toggle it


def adapter_folder(folder: Path, *, lora: dict | None = None, config: dict | None = None, names=("lora_A",)) -> Path:
    """A finished run's folder as the launcher reads it: adapter_config.json, a safetensors header, the rank spec."""
    folder.mkdir(parents=True)
    peft = {"r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"], "task_type": "CAUSAL_LM"}
    peft.update({"base_model_name_or_path": "/models/llama", **(config or {})})
    (folder / "adapter_config.json").write_text(json.dumps(peft))
    header = json.dumps(
        {f"base_model.model.x.{n}.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]} for n in names}
    )
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + b"\0" * 4)
    if lora is not None:
        spec = {"spec": {"lora": lora, "model": {"requested": "builtin:tiny-llama", "name_or_path": "/models/llama"}}}
        (folder / "fsdp_tune_resolved.json").write_text(json.dumps(spec))
    return folder


def test_a_starting_adapter_gives_its_shape_and_base(tmp_path) -> None:
    run = adapter_folder(
        tmp_path / "sft",
        lora={"r": 8, "lora_alpha": 16, "target_modules": "all-linear", "use_dora": False, "lora_dropout": 0.0},
    )
    checked = check(None, ["--method", "dpo", "--adapter", str(run), "--output_dir", str(tmp_path / "o")])
    cfg = checked.config
    assert not checked.errors, checked.findings
    assert (cfg.model.model_name_or_path, cfg.lora.lora_r, cfg.lora.lora_alpha) == ("builtin:tiny-llama", 8, 16.0)
    assert cfg.lora.use_peft_lora and cfg.lora.lora_target_modules == ("all-linear",)
    assert "starting adapter" in cfg.origin("lora.lora_r").source
    spec = spec_for("--method", "dpo", "--adapter", str(run), "--output_dir", str(tmp_path / "o"))
    assert spec.model.adapter == str(run.resolve()) and spec.model.reference == "adapter"
    assert "start: the adapter in" in describe_launch(cfg, spec, ["torchrun"])
    plain = adapter_folder(tmp_path / "peft")  # a PEFT adapter without fsdp-tune's record: its own config
    cfg = check(None, ["--method", "kto", "--adapter", str(plain), "--reference", "base"]).config
    assert (cfg.lora.lora_r, cfg.lora.lora_target_modules, cfg.model.model_name_or_path) == (
        16,
        ("q_proj", "v_proj"),
        "/models/llama",
    )


def test_a_starting_adapter_recorded_as_a_lora_spec_gives_its_peft_named_fields(tmp_path) -> None:
    """A finished run's record holds a LoraSpec: PEFT's fields set by their names (peft_args) are its shape too."""
    peft_named = {"bias": "lora_only", "peft_args": {"use_rslora": True}}
    recorded = LoraSpec(8, 16.0, 0.0, "all-linear", False, "CAUSAL_LM", **peft_named)
    run = adapter_folder(tmp_path / "sft", lora=json.loads(json.dumps(to_plain(recorded))))
    checked = check(None, ["--method", "dpo", "--adapter", str(run), "--output_dir", str(tmp_path / "o")])
    assert not checked.errors, checked.findings
    peft = checked.config.peft.args
    assert checked.config.lora.lora_r == 8 and peft.get("use_rslora") is True and peft.get("bias") == "lora_only"


@pytest.mark.parametrize(
    "flags,config,names,said",
    [
        (["--lora_r", "4"], None, ("lora_A",), "has r 16; this launch asks 4"),
        (["--model_name_or_path", "other/model"], None, ("lora_A",), "was trained on /models/llama"),
        ([], {"task_type": "SEQ_CLS"}, ("lora_A",), "a SEQ_CLS adapter"),
        ([], None, ("lora_A", "embed_tokens"), "carries embedding layers"),
        (["--method", "reward"], None, ("lora_A",), "a reward model starts from its base"),
        (["--use_dora", "--reference", "base"], {"use_dora": True}, ("lora_A",), None),
    ],
)
def test_a_starting_adapter_that_does_not_fit_is_refused(tmp_path, flags, config, names, said) -> None:
    run = adapter_folder(tmp_path / "a", config=config, names=[f"layers.0.{n}" for n in names])
    method = [] if "--method" in flags else ["--method", "dpo"]
    checked = check(None, [*method, "--adapter", str(run), *flags])
    rules = {f.rule for f in checked.errors}
    if said is None:  # --reference base resets lora_B only: not DoRA's magnitudes
        assert rules == {"FT122"}, checked.findings
        return
    assert rules == {"FT121"} and any(said in f.message for f in checked.errors), checked.findings
    missing = check(None, ["--method", "dpo", "--adapter", str(tmp_path / "nowhere")])
    assert [f.rule for f in missing.errors] == ["FT121"] and "is not a folder" in missing.errors[0].message


def test_plan_and_summary_name_the_method() -> None:
    cfg = check(None, [*LORA, "--method", "kto"]).config
    spec = spec_for(*LORA, "--method", "kto")
    text = describe_launch(cfg, spec, ["torchrun"]).splitlines()
    assert text[1].startswith("  method: KTO") and "reference: the base model" in text[2]
    assert "method:" not in describe_launch(check(None, LORA).config, spec_for(*LORA), ["torchrun"])
    summary = RunSummary(
        steps=4, loss_first=0.69, loss_last=0.2, losses=[0.69, 0.2], train_runtime_s=1, time_to_first_step_s=1,
        wall_s=2, tokens=10, tokens_per_s=5, per_rank=[RankMemory(100)], fsdp_units={}, adapter_dir="x",
        use_peft_lora=True, method="dpo",
        method_metrics={"rewards/accuracies": {"first": 0.5, "last": 1.0}, "rewards/margins": {"first": 0, "last": 2}},
    )  # fmt: skip
    assert "  dpo: reward accuracy 0.5 -> 1, reward margin 0 -> 2" in format_summary(summary).splitlines()


def test_chat_refuses_a_reward_model_and_says_what_to_do(tmp_path) -> None:
    run = adapter_folder(tmp_path / "rm", config={"task_type": "SEQ_CLS"})
    r = CliRunner().invoke(app, ["chat", str(run), "--prompt", "hi"])
    assert r.exit_code == 2 and "is a reward model" in r.output and "fsdp-tune merge --adapter" in r.output
