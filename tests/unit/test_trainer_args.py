"""The trainer's arguments as the ranks receive them: for a table of launches (every method, FSDP1, QLoRA, a
context-parallel mesh, expert parallelism, a vision model, GPU and CPU machines) `config_class(**...)` gets exactly
the dict fsdp-tune handed the ranks before the arguments were typed (tests/fixtures/trainer_kwargs.json, written by
the untyped code: the plain dict then), on the run's loading path and on a rank falling back from sharded loading.
Each key is said once (TrainerArgs' typed fields, the user's others by TRL's names, of their field's kind), and a
run's record from before TrainerArgs is still read by the resume check, or refused with what to do after a run."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.spec import from_dict, read_from, recorded_fsdp_version, recorded_trainer_kwargs, upgraded
from fsdp_tune.decide.trainer import method_args
from fsdp_tune.errors import UsageError
from fsdp_tune.preflight.resume import written_by_fsdp
from fsdp_tune.runfiles import RESOLVED_NAME
from tests.conftest import FIXTURES, REPO

H100x8 = Machine(cuda=True, gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8, driver_version="560.35.03")
H100x1 = Machine(cuda=True, gpus=1, gpu_names=("NVIDIA H100 80GB HBM3",), driver_version="560.35.03")
CPU = Machine.cpu_only()
TINY = str(FIXTURES / "tiny_lora.yaml")
GRPO = str(FIXTURES / "configs" / "recipe_grpo.yaml")
QWEN = str(FIXTURES / "vision" / "qwen2_vl")
KWARGS = FIXTURES / "trainer_kwargs.json"
LLAMA = ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--use_peft_lora", "--output_dir", "/tmp/ta"]
QLORA = [*LLAMA, "--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "bfloat16"]
MOE = {"model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "hidden_size": 64}

# name -> (config file, flags, machine); "{moe}" in the flags: a folder holding MOE's config.json
CASES: dict[str, tuple[str | None, list[str], Machine]] = {
    "sft_cpu_tiny": (TINY, ["--output_dir", "/tmp/ta"], CPU),
    "sft_gpu_bf16_8": (None, [*LLAMA, "--num_processes", "8", "--bf16", "True"], H100x8),
    "sft_gpu_fp16_user_settings": (
        None,
        [*LLAMA, "--fp16", "True", "--report_to", "tensorboard", "--learning_rate", "1e-4", "--max_steps", "3"]
        + ["--lr_scheduler_type", "cosine", "--warmup_ratio", "0.1", "--weight_decay", "0.01", "--seed", "7"]
        + ["--ddp_timeout", "600", "--ddp_backend", "nccl", "--save_total_limit", "2", "--logging_steps", "1"]
        + ["--dataloader_num_workers", "2", "--pad_to_multiple_of", "8", "--remove_unused_columns", "false"],
        H100x1,
    ),
    "sft_gradient_checkpointing_kwargs": (
        None,
        [*LLAMA, "--fsdp_activation_checkpointing", "false", "--gradient_checkpointing", "true"]
        + ["--gradient_checkpointing_kwargs", '{"use_reentrant": true}', "--logging_nan_inf_filter", "true"],
        H100x1,
    ),
    "sft_loading_transformers_full_state": (
        None,
        [*LLAMA, "--loading", "transformers", "--num_processes", "8", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
        H100x8,
    ),
    "fsdp1_size_wrap": (
        None,
        [*LLAMA, "--fsdp_version", "1", "--fsdp_auto_wrap_policy", "SIZE_BASED_WRAP", "--fsdp_min_num_params", "1000"]
        + ["--packing", "true"],
        H100x1,
    ),
    "full_finetune_8": (None, ["--output_dir", "/tmp/ta", "--num_processes", "8"], H100x8),
    "fsdp1_one_gpu": (
        None,
        [*LLAMA, "--fsdp_version", "1", "--bf16", "True", "--fsdp_backward_prefetch", "BACKWARD_PRE"]
        + ["--fsdp_forward_prefetch", "true", "--fsdp_sync_module_states", "true"],
        H100x1,
    ),
    "fsdp1_no_shard_offload": (
        None,
        [*LLAMA, "--fsdp_version", "1", "--num_processes", "8", "--fsdp_sharding_strategy", "NO_SHARD"]
        + ["--fsdp_offload_params", "true", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
        H100x8,
    ),
    "qlora_fsdp2": (
        None,
        [*QLORA, "--num_processes", "2", "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True"],
        H100x8,
    ),
    "dpo": (None, [*LLAMA, "--method", "dpo", "--loss_type", "sigmoid", "sft", "--loss_weights", "1", "0.5"], CPU),
    "kto": (None, [*LLAMA, "--method", "kto", "--beta", "0.2"], H100x1),
    "reward": (None, [*LLAMA, "--method", "reward"], CPU),
    "grpo_cpu": (GRPO, ["--output_dir", "/tmp/ta", "--use_cpu", "true", "--beta", "0.04"], CPU),
    "grpo_gpu": (GRPO, ["--output_dir", "/tmp/ta"], H100x8),
    "rloo_cpu": (GRPO, ["--method", "rloo", "--output_dir", "/tmp/ta", "--use_cpu", "true"], CPU),
    "cp_mesh": (
        None,
        ["--output_dir", "/tmp/ta", "--dataset_name", "data/train.jsonl", "--num_processes", "2"]
        + ["--use_parallelism_config", "--parallelism_config_cp_size", "2", "--parallelism_config_dp_shard_size", "1"]
        + ["--pad_to_multiple_of", "3"],
        CPU,
    ),
    "vision_qwen2_vl": (
        TINY,
        ["--output_dir", "/tmp/ta", "--model_name_or_path", QWEN, "--chat_template_format", "none"],
        CPU,
    ),
    "expert_parallel": (
        None,
        ["--use_peft_lora", "True", "--num_processes", "2", "--save_strategy", "no", "--output_dir", "/tmp/ta"]
        + ["--lora_target_modules", "q_proj", "v_proj", "--model_name_or_path", "{moe}"]
        + ["--use_parallelism_config", "--ep_size", "2"],
        CPU,
    ),
}


def spec_of(name: str, moe_folder):
    """The rank spec `train` decides for the case (the check refuses nothing)."""
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.validate import check

    config, flags, machine = CASES[name]
    if "{moe}" in flags:
        (moe_folder / "config.json").write_text(json.dumps(MOE))
        flags = [str(moe_folder) if f == "{moe}" else f for f in flags]
    checked = check(config, flags)
    assert not checked.errors, [str(f) for f in checked.findings]
    return decide(checked.config, machine)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_ranks_get_the_same_trainer_kwargs_as_before_they_were_typed(name, tmp_path) -> None:
    before = json.loads(KWARGS.read_text())[name]
    spec = spec_of(name, tmp_path)
    now = {
        "kwargs": spec.trainer_args.kwargs(),
        "fallback_kwargs": spec.trainer_args_on("transformers"),
        "fsdp_version": spec.fsdp_version,
        "precision": spec.precision,
        "checkpointing": spec.checkpointing,
        "transformers_fsdp_config": t.kwargs() if (t := spec.loading.transformers_fsdp_config) else None,
        "distributed_config": spec.loading.distributed_config.kwargs() if spec.loading.distributed_config else None,
        "loading": spec.loading.path,
    }
    # as JSON text: 1 and 1.0, or true and 1, differ there
    assert json.dumps(now, sort_keys=True, indent=1) == json.dumps(before, sort_keys=True, indent=1)
    assert from_dict(json.loads(spec.to_json())) == spec  # the ranks read the typed spec back whole


def test_a_key_is_said_once_and_each_passed_value_is_of_its_fields_kind(tmp_path) -> None:
    spec = spec_of("sft_gpu_fp16_user_settings", tmp_path)
    args = spec.trainer_args
    assert args.report_to == ["tensorboard"] and args.pad_to_multiple_of == 8 and args.ddp_backend == "nccl"
    assert args.trl_args["learning_rate"] == 1e-4 and not set(args.trl_args) & {"bf16", "fp16", "report_to"}
    for typed in ("packing", "bf16", "gradient_checkpointing"):  # a typed field, or one kwargs() derives
        with pytest.raises(ValueError, match=f"repeats typed field.*{typed}"):
            replace(args, trl_args={**args.trl_args, typed: True})
    # config parsing types every value by the installed TRL's table: another kind is fsdp-tune's bug, raised
    assert method_args("dpo", {"loss_type": ["sigmoid"], "beta": 0.1, "packing": True}) == {
        "loss_type": ["sigmoid"],
        "beta": 0.1,
    }  # DPOConfig has no packing
    for name, value in (("beta", "0.1"), ("max_steps", True), ("loss_type", "sigmoid"), ("seed", 7.0)):
        with pytest.raises(TypeError, match=f"training setting {name}="):
            method_args("dpo", {name: value})


def test_a_run_record_of_either_spec_version_is_read_back(tmp_path) -> None:
    """The resume check reads a run's recorded trainer arguments and FSDP version: a spec since 9 (TrainerArgs),
    one before it (the kwargs themselves, fsdp_version beside them), and one with fsdp_version alone."""
    spec = spec_of("fsdp1_one_gpu", tmp_path)
    before = json.loads(KWARGS.read_text())["fsdp1_one_gpu"]
    now = spec.as_dict()
    assert "fsdp_version" not in now and "precision" not in now and "checkpointing" not in now  # said once
    assert recorded_trainer_kwargs(now["trainer_args"]) == before["kwargs"]
    assert recorded_trainer_kwargs(before["kwargs"]) == before["kwargs"]  # spec 8's record: as it was
    assert recorded_fsdp_version(now) == recorded_fsdp_version({"trainer_args": before["kwargs"]}) == 1
    assert recorded_fsdp_version({"fsdp_version": 2}) == 2
    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    (run / RESOLVED_NAME).write_text(json.dumps({"spec": now}))
    assert written_by_fsdp(run / "checkpoint-2") == 1


def test_an_older_runs_record_is_refused_by_the_after_run_commands_with_what_to_do(tmp_path) -> None:
    old = {**spec_of("sft_cpu_tiny", tmp_path).as_dict(), "spec_version": 7}
    (tmp_path / RESOLVED_NAME).write_text(json.dumps({"spec": old}))
    with pytest.raises(UsageError, match="another fsdp-tune version \\(rank spec 7; this one reads 9\\)") as e:
        read_from(tmp_path)
    assert "the fsdp-tune version that trained" in e.value.hint


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_run_of_the_fsdp_tune_before_is_read_as_this_ones(name, tmp_path) -> None:
    """A run trained yesterday (rank spec 8: tests/fixtures/spec8_records.json, written by that code for these
    launches) is read by chat, merge and export today: upgraded, it is exactly the spec this code decides."""
    from fsdp_tune.sources.builtin import target

    spec = spec_of(name, tmp_path)
    text = json.dumps(json.loads((FIXTURES / "spec8_records.json").read_text())[name])
    for mark, value in (("{repo}", str(REPO)), ("{moe}", str(tmp_path)), ("{builtin}", str(target("tiny-llama")))):
        text = text.replace(mark, value)
    old = json.loads(text)
    assert old["spec_version"] == 8 and isinstance(old["trainer_args"].get("bf16"), bool)
    assert from_dict(upgraded(old)) == spec
    (tmp_path / RESOLVED_NAME).write_text(json.dumps({"spec": old}))
    assert read_from(tmp_path) == spec


def test_the_gpu_checks_mfu_reads_checkpointing_from_the_recorded_spec(tmp_path) -> None:
    """benchmarks/gpu_runs.py counts recomputation's FLOPs as the run's spec says (spec 9 no longer stores
    `checkpointing`: reading the key said "recomputed" for every run); spec 8's record too."""
    from benchmarks.gpu_runs import recomputes

    seen = set()
    for name in ("sft_cpu_tiny", "sft_gradient_checkpointing_kwargs", "full_finetune_8"):
        spec = spec_of(name, tmp_path)
        assert recomputes({"spec": spec.as_dict()}) is (spec.checkpointing != "off"), name
        seen.add(spec.checkpointing)
    assert "off" in seen and len(seen) > 1, seen
    assert recomputes({}) is True
