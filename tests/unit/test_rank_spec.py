"""GPU decisions as data: the RankSpec fsdp-tune decides for machines this one is not (no GPU runs here).

Each row is a machine (GPU count and model, driver) and a launch; the expected fields are what the ranks then
execute. The reasons are in decide/rank.py, each with the library source it follows.
"""

from __future__ import annotations

import pytest

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.spec import MixedPrecision
from fsdp_tune.launch.torchrun import torchrun_args
from fsdp_tune.typed import to_plain
from tests.conftest import REPO, seed_flags, spec_for

H100x8 = Machine(cuda=True, gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8, driver_version="560.35.03")
H100x1 = Machine(cuda=True, gpus=1, gpu_names=("NVIDIA H100 80GB HBM3",), driver_version="560.35.03")
RTX4090x2_OLD = Machine(cuda=True, gpus=2, gpu_names=("NVIDIA GeForce RTX 4090",) * 2, driver_version="535.104.05")
RTX4090x2_NEW = Machine(cuda=True, gpus=2, gpu_names=("NVIDIA GeForce RTX 4090",) * 2, driver_version="550.54.14")
CPU_ONLY = Machine.cpu_only()
LORA = ["--use_peft_lora", "--output_dir", "/tmp/spec"]
QLORA = [*LORA, "--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "bfloat16"]


def get(spec, path: str):
    """The value at a dotted path: a field, a property, or a method's answer (`trainer_args.kwargs.fp16`), as JSON."""
    value = spec
    for part in path.split("."):
        value = value[part] if isinstance(value, dict) else getattr(value, part)
        value = value() if callable(value) else value
    return to_plain(value)


SCENARIOS = [
    (
        "1 GPU, FSDP2 LoRA bf16",
        H100x1,
        [*LORA, "--bf16", "True"],
        {"device": "cuda", "backend": "nccl", "precision": "bf16", "model.dtype": "bfloat16", "parallelism": None},
    ),
    (
        "8 GPUs, FSDP2 + cpu_offload: gloo beside NCCL for the offloaded gradients",
        H100x8,
        [*LORA, "--num_processes", "8", "--fsdp_offload_params", "true", "--bf16", "True"],
        {"backend": "cuda:nccl,cpu:gloo", "trainer_args.fsdp_config.cpu_offload": True},
    ),
    (
        "2 x RTX 4090 on a driver before 550.40.07: NCCL P2P/IB off, as accelerate launch does",
        RTX4090x2_OLD,
        [*LORA, "--num_processes", "2"],
        {"env.NCCL_P2P_DISABLE": "1", "env.NCCL_IB_DISABLE": "1"},
    ),
    (
        "QLoRA FSDP2, fp32 storage under bf16: FSDP2 keeps the packed weights in their storage dtype",
        H100x8,
        [*QLORA, "--num_processes", "2", "--bnb_4bit_quant_storage_dtype", "float32", "--bf16", "True"],
        {
            "fsdp_mixed_precision": {"param_dtype": "float32", "reduce_dtype": "float32", "output_dtype": "float32"},
            "model.dtype": "float32",
            "model.quantization.bnb_4bit_quant_storage": "float32",
        },
    ),
    (
        "QLoRA FSDP2, bf16 storage: the policy is bf16",
        H100x8,
        [*QLORA, "--num_processes", "2", "--bnb_4bit_quant_storage_dtype", "bfloat16", "--bf16", "True"],
        {"fsdp_mixed_precision.param_dtype": "bfloat16", "model.dtype": "bfloat16"},
    ),
    (
        "FSDP1 on one GPU: NO_SHARD, use_orig_params off; the adapter saved and reloaded unit by unit (a full state "
        "dict of an unsharded unit clones the whole model on the GPU)",
        H100x1,
        [*LORA, "--fsdp_version", "1", "--bf16", "True"],
        {
            "fsdp_version": 1,
            "trainer_args.kwargs.fsdp_config.use_orig_params": False,
            "fsdp_mixed_precision": None,
            "save.final": "fsdp1_units",
            "save.resume": "fsdp1_units",
        },
    ),
    (
        "FSDP1 NO_SHARD on 8 GPUs with cpu_offload: unit by unit, never torch's full state dict",
        H100x8,
        [*LORA, "--fsdp_version", "1", "--num_processes", "8", "--fsdp_sharding_strategy", "NO_SHARD"]
        + ["--fsdp_offload_params", "true", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
        {"save.final": "fsdp1_units", "save.resume": "fsdp1_units", "full_state_dict": True},
    ),
    (
        "FSDP1 on one GPU, FULL_STATE_DICT checkpoints: the checkpoint is the adapter file, saved unit by unit as the "
        "final save is (accelerate's save_fsdp_model would take FSDP1's full state dict of the whole model on the GPU)",
        H100x1,
        [*LORA, "--fsdp_version", "1", "--bf16", "True", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
        {"save.final": "fsdp1_units", "save.checkpoint": "adapter_file", "full_state_dict": True},
    ),
    (
        "FSDP1, SHARDED_STATE_DICT checkpoints: accelerate's sharded save (each rank its shard)",
        H100x8,
        [*LORA, "--fsdp_version", "1", "--num_processes", "8", "--fsdp_state_dict_type", "SHARDED_STATE_DICT"],
        {"save.final": "fsdp1_units", "save.checkpoint": "accelerate", "full_state_dict": False},
    ),
    (
        "full fine-tuning with FULL_STATE_DICT checkpoints: the model itself is the checkpoint (accelerate's save)",
        H100x8,
        ["--output_dir", "/tmp/spec", "--num_processes", "8", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
        {"lora": None, "save.checkpoint": "accelerate", "full_state_dict": True},
    ),
    (
        "FSDP2 + cpu_offload: the adapter gathered alone; resume copies each rank's rows into its host shards "
        "(set_model_state_dict refuses host weights beside GPU buffers)",
        H100x8,
        [*LORA, "--num_processes", "8", "--fsdp_offload_params", "true", "--fsdp_state_dict_type", "FULL_STATE_DICT"],
        {
            "save.final": "gather_trainable",
            "save.resume": "local_rows",
            "save.checkpoint": "adapter_file",
            "full_state_dict": True,
            "loading.sharded.cpu_offload": True,
        },
    ),
    (
        "one process on the CPU of a GPU machine: GPUs hidden, the CPU shim (whose default mesh is the CPU: "
        "accelerate builds no mesh for one process)",
        H100x8,
        [*LORA, "--use_cpu", "true", "--num_processes", "1"],
        {"device": "cpu", "backend": "gloo", "env.CUDA_VISIBLE_DEVICES": "", "cpu_fsdp_shim": True},
    ),
    (
        "two nodes of 8, c10d rendezvous",
        H100x8,
        [*LORA, "--num_processes", "16", "--num_machines", "2", "--machine_rank", "1"]
        + ["--main_process_ip", "10.0.0.1", "--rdzv_backend", "c10d"],
        {"world.nnodes": 2, "world.nproc_per_node": 8, "world.node_rank": 1, "world.standalone": False},
    ),
    (
        "HSDP across two nodes: replicate across, shard within",
        H100x8,
        [*LORA, "--num_processes", "16", "--num_machines", "2", "--main_process_ip", "10.0.0.1"]
        + ["--use_parallelism_config", "--parallelism_config_dp_replicate_size", "2"],
        {"parallelism.dp_replicate_size": 2, "parallelism.dp_shard_size": 8},
    ),
    (
        "a CPU run on a machine with GPUs: the ranks do not see them, and the mesh is built on the CPU",
        H100x8,
        [*LORA, "--use_cpu", "true", "--num_processes", "2"],
        {
            "device": "cpu",
            "backend": "gloo",
            "env.CUDA_VISIBLE_DEVICES": "",
            "parallelism.dp_shard_size": 2,
            "trainer_args.use_cpu": True,
        },
    ),
    (
        "FSDP activation checkpointing: the Trainer's own gradient checkpointing (TRL's default) yields",
        H100x8,
        [*LORA, "--num_processes", "2", "--fsdp_activation_checkpointing", "true"],
        {"checkpointing": "fsdp", "trainer_args.activation_checkpointing": False},
    ),
    (
        "fp16 AMP: the model stays fp32 under the scaler; the NaN guard does not watch the scaled grad norm",
        H100x8,
        [*LORA, "--num_processes", "2", "--fp16", "True"],
        {"precision": "fp16", "model.dtype": "float32", "check_grad_norm": False, "trainer_args.kwargs.fp16": True},
    ),
]


@pytest.mark.parametrize("name,machine,flags,expected", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_gpu_scenario(name: str, machine: Machine, flags: list[str], expected: dict) -> None:
    spec = spec_for(*flags, machine=machine)
    got = {path: get(spec, path) for path in expected}
    assert got == expected


def test_rtx_40_with_a_new_driver_keeps_nccl_p2p() -> None:
    env = spec_for(*LORA, "--num_processes", "2", machine=RTX4090x2_NEW).env
    assert "NCCL_P2P_DISABLE" not in env and "NCCL_IB_DISABLE" not in env


def test_gpu_plan_and_cpu_plan_of_one_config_differ_only_where_the_machine_decides() -> None:
    gpu = spec_for(*LORA, "--num_processes", "2", "--bf16", "True", machine=H100x8).as_dict()
    cpu = spec_for(*LORA, "--num_processes", "2", "--bf16", "True", machine=CPU_ONLY).as_dict()
    differing = {k for k in gpu if gpu[k] != cpu[k]}
    assert differing == {"device", "backend", "cpu_fsdp_shim", "trainer_args", "parallelism"}


@pytest.mark.parametrize("script", ["run_peft_fsdp.sh", "run_peft_qlora_fsdp.sh"])
def test_seed_launches_on_their_gpus(script: str) -> None:
    """The PEFT guide's launches on the machines they were written for: 8 and 2 GPUs. Their YAML has no
    fsdp_version: FSDP2 (config/fsdp2.py), FULL_SHARD as reshard_after_forward, loaded sharded."""
    config, flags = seed_flags(script)
    spec = spec_for(*flags, machine=H100x8, config=str(REPO / config))
    f = spec.fsdp_config
    assert (spec.device, spec.fsdp_version, f.reshard_after_forward, f.state_dict_type) == (
        "cuda",
        2,
        True,
        "SHARDED_STATE_DICT",
    )
    assert "use_orig_params" not in f.kwargs() and spec.loading.path == "sharded"
    assert "--nproc_per_node=" + str(spec.world.nproc_per_node) in torchrun_args(spec)
    if script == "run_peft_qlora_fsdp.sh":  # offload on: gloo beside NCCL; FSDP2 gathers in the storage dtype
        assert spec.backend == "cuda:nccl,cpu:gloo" and spec.loading.sharded.cpu_offload is True
        assert spec.fsdp_mixed_precision == MixedPrecision("bfloat16", "bfloat16", "bfloat16")
        assert spec.model.quantization.bnb_4bit_quant_storage == "bfloat16" and spec.model.dtype == "bfloat16"
    else:
        assert spec.backend == "nccl" and spec.precision == "bf16" and spec.world.world_size == 8


@pytest.mark.parametrize("script", ["run_peft_fsdp.sh", "run_peft_qlora_fsdp.sh"])
def test_seed_launches_keep_fsdp1_when_asked(script: str) -> None:
    """`--fsdp_version 1` (or `fsdp_version: 1` in the file) keeps what `accelerate launch` runs: FSDP1, its
    strategy and use_orig_params as written, loaded with from_pretrained."""
    config, flags = seed_flags(script)
    spec = spec_for(*flags, "--fsdp_version", "1", machine=H100x8, config=str(REPO / config))
    f = spec.fsdp_config
    assert (spec.fsdp_version, f.reshard_after_forward, f.use_orig_params) == (1, "FULL_SHARD", False)
    assert spec.loading.path == "transformers" and spec.fsdp_mixed_precision is None


@pytest.mark.parametrize(
    "flags,expected",
    [
        ((), {"seed": 42, "data.seed": 42, "evaluation": False, "full_state_dict": False, "method.name": "sft"}),
        (
            (
                "--seed",
                "7",
                "--data_seed",
                "11",
                "--eval_strategy",
                "steps",
                "--fsdp_state_dict_type",
                "FULL_STATE_DICT",
            ),
            {"seed": 7, "data.seed": 11, "evaluation": True, "full_state_dict": True, "method.name": "sft"},
        ),
        (("--seed", "7"), {"seed": 7, "data.seed": 7}),
    ],
    ids=["TRL's defaults", "all set", "data seed follows the seed"],
)
def test_what_the_rank_once_decided_itself_comes_in_the_spec(flags, expected) -> None:
    """The seed (TRL's 42 when not given: the launcher's default, not the rank's), the data's seed, whether the
    Trainer evaluates, and whether checkpoints are FULL_STATE_DICT (fsdp-tune's gather saves them)."""
    spec = spec_for(*LORA, *flags, machine=H100x8).as_dict()
    assert {path: get(spec, path) for path in expected} == expected
