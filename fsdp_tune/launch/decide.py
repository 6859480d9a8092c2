"""decide(): the typed RunConfig and this Machine -> the RankSpec every rank executes.

Each decision is made here once (litgpt's `setup()` decides, `main(fabric)` executes): the device and the
process-group backend, every dtype, gradient vs activation checkpointing, the exact `fsdp_config` and
SFTConfig arguments Transformers receives, and the ranks' environment. Pure: no torch, no files written.
"""

from __future__ import annotations

import os
from typing import Any

from fsdp_tune.config.derived import (
    TRL_LOSS_FLAGS,
    compute_precision,
    gradient_checkpointing,
    mesh_sizes,
    model_dtype,
    offload_active,
    quant_storage,
)
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.launch.decide_data import data_spec
from fsdp_tune.launch.machine import Machine
from fsdp_tune.launch.spec import ModelSpec, RankSpec, World

DEFAULT_OUTPUT_DIR = "fsdp-tune-output"
DEFAULT_TIMEOUT_S = 1800  # TrainingArguments' ddp_timeout default


def decide(cfg: RunConfig, machine: Machine, resume: str | None = None) -> RankSpec:
    on_cpu = cfg.launch.use_cpu or not machine.cuda
    device = "cpu" if on_cpu else "cuda"
    output_dir = os.path.abspath(str(cfg.training.get("output_dir") or DEFAULT_OUTPUT_DIR))
    args = trainer_args(cfg, on_cpu, output_dir)
    checkpointing = (
        "fsdp" if cfg.fsdp.activation_checkpointing else "gradient" if args["activation_checkpointing"] else "off"
    )
    return RankSpec(
        world=world(cfg),
        device=device,
        backend=backend(cfg, on_cpu),
        timeout_s=int(cfg.training.get("ddp_timeout") or DEFAULT_TIMEOUT_S),
        env=rank_env(cfg, machine, on_cpu),
        cpu_fsdp_shim=on_cpu,
        fsdp_version=cfg.fsdp.version,
        precision=compute_precision(cfg),
        checkpointing=checkpointing,
        use_reentrant=cfg.run.use_reentrant,
        trainer_args=args,
        parallelism=mesh(cfg),
        model=model_spec(cfg),
        lora=lora_kwargs(cfg),
        data=data_spec(cfg),
        output_dir=output_dir,
        resume_from_checkpoint=resume,
        checkpoint_on_stop=cfg.training.get("save_strategy") != "no" and cfg.run.save_on_interrupt,
        check_grad_norm=not args["fp16"],
        notes=_notes(cfg, on_cpu),
    )


def world(cfg: RunConfig) -> World:
    lc = cfg.launch
    single = lc.num_machines == 1
    return World(
        world_size=lc.num_processes,
        nnodes=lc.num_machines,
        nproc_per_node=lc.nproc_per_node,
        node_rank=lc.machine_rank,
        master_addr=lc.main_process_ip or "127.0.0.1",
        master_port=lc.main_process_port,
        rdzv_backend=lc.rdzv_backend,
        # one machine and no port asked for: let torchrun pick a free port (two runs can share a host)
        standalone=single and not cfg.is_set("launch.main_process_port"),
        max_restarts=lc.max_restarts,
    )


def mesh(cfg: RunConfig) -> dict[str, Any] | None:
    """accelerate's ParallelismConfig for the run (the device mesh), or None for plain FSDP over all ranks.

    The sizes are the ones the rules checked against the world size (FT044); dp_shard_size left unset
    takes what the other dimensions leave, as accelerate does."""
    p = cfg.parallelism
    if not p.enabled:
        return None
    sizes = mesh_sizes(cfg)
    if all(v == 1 for k, v in sizes.items() if k != "dp_shard_size"):
        return None  # only dp_shard: exactly what plain FSDP does
    out: dict[str, Any] = {k: v for k, v in sizes.items() if k != "sp_size"}
    if p.cp_size > 1:
        out["cp_comm_strategy"] = p.cp_comm_strategy
    return out


def backend(cfg: RunConfig, on_cpu: bool) -> str:
    """gloo on CPU; NCCL on GPUs, with gloo beside it for the CPU tensors cpu_offload leaves (gradient
    clipping all-reduces the offloaded gradients' norms on the CPU), as accelerate does (state.py)."""
    if on_cpu:
        return "gloo"
    return "cuda:nccl,cpu:gloo" if offload_active(cfg, on_cpu) else "nccl"


def fsdp_config(cfg: RunConfig, on_cpu: bool) -> dict[str, Any]:
    """Transformers' `fsdp_config` dict, in the spelling TrainingArguments reads."""
    f = cfg.fsdp
    out: dict[str, Any] = {
        "version": f.version,
        "cpu_offload": offload_active(cfg, on_cpu),
        "auto_wrap_policy": f.auto_wrap_policy,
        "state_dict_type": f.state_dict_type,
        "cpu_ram_efficient_loading": f.cpu_ram_efficient_loading,
        "activation_checkpointing": f.activation_checkpointing,
    }
    if f.version == 1:
        out["reshard_after_forward"] = f.sharding_strategy or (
            "FULL_SHARD" if f.reshard_after_forward else "SHARD_GRAD_OP"
        )
        for key in ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states"):
            if getattr(f, key) is not None:
                out[key] = getattr(f, key)
    else:
        out["reshard_after_forward"] = f.reshard_after_forward
    if f.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and f.transformer_layer_cls_to_wrap:
        out["transformer_layer_cls_to_wrap"] = list(f.transformer_layer_cls_to_wrap)
    if f.auto_wrap_policy == "SIZE_BASED_WRAP":
        out["min_num_params"] = f.min_num_params
    return out


def trainer_args(cfg: RunConfig, on_cpu: bool, output_dir: str) -> dict[str, Any]:
    """SFTConfig's arguments: the user's training settings, and what fsdp-tune decides for them."""
    args: dict[str, Any] = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.training.args.items()}
    precision = compute_precision(cfg)
    args.update(
        output_dir=output_dir,
        fsdp=True,
        fsdp_config=fsdp_config(cfg, on_cpu),
        bf16=precision in ("bf16", "fp8"),
        fp16=precision == "fp16",
        use_cpu=on_cpu,
        max_length=cfg.data.max_seq_len,
        packing=cfg.data.packing,
        dataset_text_field=cfg.data.dataset_text_field,
        # transformers 5 renamed the Trainer's gradient_checkpointing to activation_checkpointing
        activation_checkpointing=gradient_checkpointing(cfg),
    )
    args.pop("gradient_checkpointing", None)
    kwargs = args.pop("gradient_checkpointing_kwargs", None) or {}
    args.pop("resume_from_checkpoint", None)  # resolved by the launcher: RankSpec.resume_from_checkpoint
    args.pop("overwrite_output_dir", None)
    for name in TRL_LOSS_FLAGS:  # our rows carry their answer masks: read as --train_on_prompt (decide_data.py)
        args.pop(name, None)
    if args["activation_checkpointing"]:
        args["activation_checkpointing_kwargs"] = {"use_reentrant": cfg.run.use_reentrant, **kwargs}
    if on_cpu:
        args["ddp_backend"] = "gloo"
    if not args["fp16"]:
        args.setdefault("logging_nan_inf_filter", False)  # a NaN must show as NaN (see NanGuardCallback)
    args.setdefault("report_to", "none")
    return args


def attention(cfg: RunConfig) -> str:
    if cfg.model.use_flash_attn:
        return "flash_attention_2"
    return cfg.model.attn_implementation or "sdpa"


def model_spec(cfg: RunConfig) -> ModelSpec:
    q = cfg.quantization
    quantization = None
    if q.use_4bit_quantization:
        quantization = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": q.bnb_4bit_quant_type,
            "bnb_4bit_compute_dtype": q.bnb_4bit_compute_dtype,
            "bnb_4bit_use_double_quant": q.use_nested_quant,
            "bnb_4bit_quant_storage": quant_storage(cfg),
        }
    name = cfg.model.model_name_or_path or ""
    template = cfg.data.chat_template_format
    return ModelSpec(
        name_or_path=name,
        requested=name,
        dtype=model_dtype(cfg),
        attn_implementation=attention(cfg),
        trust_remote_code=cfg.model.trust_remote_code,
        quantization=quantization,
        chat_template=None if template == "none" else template,
    )


def lora_kwargs(cfg: RunConfig) -> dict[str, Any] | None:
    lo = cfg.lora
    if not lo.use_peft_lora:
        return None
    targets = lo.lora_target_modules
    return {
        "r": lo.lora_r,
        "lora_alpha": lo.lora_alpha,
        "lora_dropout": lo.lora_dropout,
        "target_modules": "all-linear" if targets == ("all-linear",) else list(targets),
        "use_dora": lo.use_dora,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }


def rank_env(cfg: RunConfig, machine: Machine, on_cpu: bool) -> dict[str, str]:
    """The ranks' environment: what accelerate launch exports for the config's launch keys
    (accelerate/utils/launch.py), so the ranks' Accelerator behaves the same, and fsdp-tune's own."""
    lc = cfg.launch
    env: dict[str, str] = {
        "PYTHONUNBUFFERED": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": str(cfg.fsdp.cpu_ram_efficient_loading).lower(),
    }
    if on_cpu and machine.cuda:
        # a CPU run on a machine with GPUs: fully_shard would put the shards on the default accelerator
        # under a gloo group; the ranks must not see the GPUs at all
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif lc.gpu_ids and lc.gpu_ids != "all" and not on_cpu:
        env["CUDA_VISIBLE_DEVICES"] = lc.gpu_ids
    if cfg.fsdp.activation_checkpointing_offload and not on_cpu:
        # accelerate's plugin reads it from the environment (Transformers' fsdp_config does not carry it)
        env["FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"] = "true"
    if lc.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    if lc.accelerate_debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if lc.dynamo_backend.lower() != "no":
        env.update(
            ACCELERATE_DYNAMO_BACKEND=lc.dynamo_backend.upper(),
            ACCELERATE_DYNAMO_MODE=lc.dynamo_mode,
            ACCELERATE_DYNAMO_USE_FULLGRAPH=str(lc.dynamo_use_fullgraph),
            ACCELERATE_DYNAMO_USE_DYNAMIC=str(lc.dynamo_use_dynamic),
            ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=str(lc.dynamo_use_regional_compilation),
        )
    return env


def _notes(cfg: RunConfig, on_cpu: bool) -> tuple[str, ...]:
    notes = []
    if cfg.fsdp.cpu_offload and not offload_active(cfg, on_cpu):
        notes.append("cpu_offload has no effect on a CPU run: off")
    if cfg.fsdp.activation_checkpointing_offload and on_cpu:
        notes.append("activation_checkpointing_offload has no effect on a CPU run: off")
    return tuple(notes)
