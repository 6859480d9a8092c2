"""Which runs load sharded and which from_pretrained, and why: decided on the launcher (decide/loading.py) and
carried in the rank spec, with what the sharded builder applies in accelerate's place (no torch, no launch)."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.decide.spec import MixedPrecision, ShardedPlan
from fsdp_tune.output.run import describe_launch
from fsdp_tune.validate import check
from tests.conftest import spec_for

GPUS = Machine(cuda=True, gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8)
CPU = Machine.cpu_only()
LORA = ["--use_peft_lora", "True", "--output_dir", "/tmp/loading", "--num_processes", "2"]
QLORA = [*LORA, "--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "bfloat16"]


def _local_model(tmp_path, name: str, config: dict, weights: str = "model.safetensors") -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    (folder / weights).write_bytes(b"")
    return str(folder)


FALLBACKS = [
    ("FSDP1", ["--fsdp_version", "1"], "FSDP1"),
    ("full fine-tuning", ["--use_peft_lora", "False"], "full fine-tuning"),
    ("NO_WRAP", ["--fsdp_auto_wrap_policy", "NO_WRAP"], "auto_wrap_policy NO_WRAP"),
    ("DoRA", ["--use_dora", "True"], "DoRA"),
    ("trainable tokens", ["--trainable_token_indices", "5", "6"], "trainable_token_indices"),
    ("asked for", ["--loading", "transformers"], "asked for"),
    ("a mixture of experts", ["--model_name_or_path", "mistralai/Mixtral-8x7B-v0.1"], "mixture of experts"),
    ("remote code not on this machine", ["--model_name_or_path", "acme/x", "--trust_remote_code", "True"], "remote"),
    ("chat_template_path", ["--chat_template_path", "acme/other-model"], "chat_template_path"),
]


@pytest.mark.parametrize("name,flags,reason", FALLBACKS, ids=[f[0] for f in FALLBACKS])
def test_runs_sharded_loading_cannot_take_load_through_transformers_and_say_why(name, flags, reason) -> None:
    spec = spec_for(*LORA, *flags, machine=GPUS)
    assert spec.loading.path == "transformers" and reason in spec.loading.why
    assert spec.loading.sharded is None and spec.loading.transformers_fsdp_config is None
    assert spec.fsdp_config.auto_wrap_policy != "NO_WRAP" or name == "NO_WRAP"  # accelerate wraps, as today


@pytest.mark.parametrize("machine", [GPUS, CPU], ids=["gpus", "cpu"])
def test_context_parallelism_loads_sharded_over_the_dp_shard_x_cp_mesh(machine) -> None:
    """Run on CPU ranks (tests/dist/test_train_variants.py: cp 2, sharded loading, the losses of one process); on
    GPUs the same builder, by reading."""
    cp = ["--num_processes", "4", "--use_parallelism_config", "--parallelism_config_cp_size", "2"]
    spec = spec_for(*LORA, *cp, machine=machine)
    assert spec.loading.path == "sharded" and spec.loading.why is None
    assert spec.parallelism.cp_size == 2 and spec.parallelism.dp_shard_size == 2


def test_model_files_on_this_machine_decide_too(tmp_path) -> None:
    def note(folder: str, *flags: str) -> str | None:
        return spec_for(*LORA, "--model_name_or_path", folder, *flags, machine=GPUS).loading.why

    assert "no safetensors" in note(_local_model(tmp_path, "bins", {}, weights="pytorch_model.bin"))
    assert "quantized already" in note(
        _local_model(tmp_path, "gptq", {"quantization_config": {"quant_method": "gptq"}})
    )
    remote = _local_model(tmp_path, "remote", {"auto_map": {"AutoModelForCausalLM": "m.M"}})
    assert "auto_map" in note(remote, "--trust_remote_code", "True")
    assert note(remote) is None  # without trust_remote_code transformers builds its own class
    assert note(_local_model(tmp_path, "plain", {})) is None


def test_lora_on_gpus_loads_sharded_and_the_builder_does_what_accelerate_would() -> None:
    spec = spec_for(*LORA, "--bf16", "True", "--fsdp_activation_checkpointing", "true", machine=GPUS)
    assert spec.loading.path == "sharded" and spec.loading.why is None
    # the Trainer gets a model that is sharded already: accelerate must neither wrap it nor checkpoint it
    f = spec.fsdp_config
    assert f.auto_wrap_policy == "NO_WRAP" and f.activation_checkpointing is False
    assert "transformer_layer_cls_to_wrap" not in f.kwargs()
    units = spec.loading.transformers_fsdp_config
    assert units.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"
    assert units.activation_checkpointing is True  # for a rank that falls back
    fallen_back = spec.trainer_args_on("transformers")  # that rank's SFTConfig, decided here
    assert fallen_back["fsdp_config"] == units.kwargs() and spec.trainer_args_on("sharded") == spec.trainer_args_on()
    assert {k: v for k, v in fallen_back.items() if k != "fsdp_config"} == {
        k: v for k, v in spec.trainer_args.kwargs().items() if k != "fsdp_config"
    }
    # accelerate: the plugin's policy is the run's precision for every dtype; trainable weights upcast to fp32
    bf16 = MixedPrecision("bfloat16", "bfloat16", "bfloat16")
    assert spec.loading.sharded == ShardedPlan(
        layer_cls=(),
        reshard_after_forward=True,
        activation_checkpointing=True,
        activation_checkpointing_offload=False,
        cpu_offload=False,
        mp_policy=bf16,
        upcast_trainable=True,
        may_fall_back=True,
    )
    assert spec.checkpointing == "fsdp"
    assert spec.unit_fsdp_config.auto_wrap_policy == "TRANSFORMER_BASED_WRAP"


def test_qlora_takes_the_storage_policy_fsdp2_gets_today_and_no_upcast() -> None:
    spec = spec_for(*QLORA, "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True", machine=GPUS)
    assert spec.loading.path == "sharded"
    assert spec.loading.sharded.mp_policy == spec.fsdp_mixed_precision  # decide/rank.py fsdp2_qlora_policy
    assert spec.loading.sharded.upcast_trainable is False


def test_cpu_run_without_mixed_precision_keeps_the_default_policy_and_its_mesh() -> None:
    spec = spec_for(*LORA, machine=CPU)
    assert spec.loading.path == "sharded" and spec.loading.sharded.mp_policy is None
    assert spec.loading.sharded.upcast_trainable is False
    assert spec.parallelism.dp_shard_size == 2  # the builder shards over the mesh the Trainer's Accelerator uses


def test_offload_layer_classes_and_hsdp_reach_the_builder() -> None:
    spec = spec_for(
        *LORA,
        *("--num_processes", "4", "--fsdp_offload_params", "true", "--fsdp_transformer_layer_cls_to_wrap"),
        *("LlamaDecoderLayer", "--use_parallelism_config", "--parallelism_config_dp_replicate_size", "2"),
        machine=GPUS,
    )
    assert spec.loading.path == "sharded"
    assert spec.loading.sharded.cpu_offload is True and spec.loading.sharded.layer_cls == ("LlamaDecoderLayer",)
    assert spec.parallelism.dp_replicate_size == 2


def test_asked_for_sharded_loading_is_honoured_or_refused() -> None:
    spec = spec_for(*LORA, "--loading", "sharded", machine=GPUS)
    assert spec.loading.path == "sharded" and spec.loading.sharded.may_fall_back is False  # a rank stops instead
    refused = check(None, [*LORA, "--loading", "sharded", "--fsdp_version", "1"])
    [finding] = [f for f in refused.findings if f.rule == "FT036"]
    assert finding.severity.name == "ERROR" and "FSDP1" in finding.message and finding.key == "--loading"


def test_the_launch_plan_says_how_the_model_loads() -> None:
    checked = check(None, [*LORA, "--model_name_or_path", "builtin:tiny-llama"])
    spec = decide(checked.config, GPUS)
    text = describe_launch(checked.config, spec, ["torchrun"])
    assert "loading: sharded: each rank reads only its own shards" in text
    assert "wrap TRANSFORMER_BASED_WRAP" in text  # the units the builder makes, not the Trainer's NO_WRAP
    fsdp1 = check(None, [*LORA, "--fsdp_version", "1"])
    assert "loading: transformers: from_pretrained on every rank (FSDP1" in describe_launch(
        fsdp1.config, decide(fsdp1.config, GPUS), ["torchrun"]
    )
