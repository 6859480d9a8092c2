"""Key tables: how each format and each flag spells a setting, as data (one row per rename).

A value of `None` in a table means "accepted and has no effect on a run" (accelerate writes many keys
for its own wizard or for TPUs). Every other value is a canonical path `section.field` of RunConfig.
"""

from __future__ import annotations

# accelerate's ClusterConfig top-level keys.
ACCELERATE_TOP: dict[str, str | None] = {
    "distributed_type": "launch.distributed_type",
    "num_processes": "launch.num_processes",
    "num_machines": "launch.num_machines",
    "machine_rank": "launch.machine_rank",
    "main_process_ip": "launch.main_process_ip",
    "main_process_port": "launch.main_process_port",
    "rdzv_backend": "launch.rdzv_backend",
    "mixed_precision": "launch.mixed_precision",
    "use_cpu": "launch.use_cpu",
    "max_restarts": "launch.max_restarts",
    "gpu_ids": "launch.gpu_ids",
    "enable_cpu_affinity": "launch.enable_cpu_affinity",
    "debug": "launch.accelerate_debug",
    "dynamo_backend": "launch.dynamo_backend",  # older configs: top level; newer: under dynamo_config
    **dict.fromkeys(
        (
            "compute_environment same_network main_training_function "
            "downcast_bf16 tpu_name tpu_zone tpu_use_cluster tpu_use_sudo command_file commands tpu_vm "
            "tpu_env fp8_config mpirun_config ipex_config megatron_lm_config "
            "deepspeed_config fp16"
        ).split()
    ),
}

# dynamo_config keys (accelerate writes them with the dynamo_ prefix)
DYNAMO_KEYS = ("backend", "mode", "use_fullgraph", "use_dynamic", "use_regional_compilation")

# fsdp_config keys, after an optional `fsdp_` prefix is stripped (both tools accept both spellings).
FSDP_KEYS: dict[str, str | None] = {
    "version": "fsdp.version",
    "reshard_after_forward": "fsdp.reshard_after_forward",
    "sharding_strategy": "fsdp.sharding_strategy",
    "offload_params": "fsdp.cpu_offload",  # accelerate's name
    "cpu_offload": "fsdp.cpu_offload",  # transformers' name
    "auto_wrap_policy": "fsdp.auto_wrap_policy",
    "transformer_layer_cls_to_wrap": "fsdp.transformer_layer_cls_to_wrap",
    "transformer_cls_names_to_wrap": "fsdp.transformer_layer_cls_to_wrap",  # the plugin's field name
    "min_num_params": "fsdp.min_num_params",
    "state_dict_type": "fsdp.state_dict_type",
    "cpu_ram_efficient_loading": "fsdp.cpu_ram_efficient_loading",
    "activation_checkpointing": "fsdp.activation_checkpointing",
    "activation_checkpointing_offload": "fsdp.activation_checkpointing_offload",
    "backward_prefetch": "fsdp.backward_prefetch",
    "forward_prefetch": "fsdp.forward_prefetch",
    "sync_module_states": "fsdp.sync_module_states",
    "use_orig_params": "fsdp.use_orig_params",
    # TPU-only keys of transformers' fsdp_config: accepted; a true `xla` is refused by a rule.
    "xla": "fsdp.xla",
    "xla_fsdp_v2": "fsdp.xla",
    "xla_fsdp_settings": None,
    "xla_fsdp_grad_ckpt": None,
    "limit_all_gathers": None,
}

# Keys that only FSDP1 reads: under FSDP2 they are dropped with a warning saying why.
FSDP1_ONLY = {
    "fsdp.sharding_strategy": "use reshard_after_forward (FULL_SHARD -> true, SHARD_GRAD_OP -> false)",
    "fsdp.backward_prefetch": "FSDP2 always prefetches the next unit in backward",
    "fsdp.forward_prefetch": "FSDP2 has no forward_prefetch; accelerate refuses it even when false",
    "fsdp.sync_module_states": "FSDP2 broadcasts from rank 0 when cpu_ram_efficient_loading is on",
    "fsdp.use_orig_params": "FSDP2 always uses the original parameters",
}

# FSDP1 sharding strategy -> FSDP2 reshard_after_forward (accelerate's to_fsdp2 table).
STRATEGY_TO_RESHARD = {
    "FULL_SHARD": True,
    "HYBRID_SHARD": True,
    "SHARD_GRAD_OP": False,
    "HYBRID_SHARD_ZERO2": False,
    "NO_SHARD": False,
}
STRATEGY_BY_NUMBER = {
    "1": "FULL_SHARD",
    "2": "SHARD_GRAD_OP",
    "3": "NO_SHARD",
    "4": "HYBRID_SHARD",
    "5": "HYBRID_SHARD_ZERO2",
}

PARALLELISM_PREFIX = "parallelism_config_"
PARALLELISM_KEYS = (
    "dp_replicate_size dp_shard_size tp_size cp_size cp_backend cp_comm_strategy sp_size sp_backend "
    "sp_seq_length sp_seq_length_is_variable sp_attn_implementation ep_size"
).split()

# Flag spellings that differ from the field they set. Everything else: a field name of the
# model/data/lora/quantization/run sections, `launch` fields, `fsdp_<key>`,
# `parallelism_config_<key>`, or any SFTConfig field.
# TrainingArguments names that transformers 5 retired, still common in launch scripts and blog posts.
# name -> (new path or None when dropped, value map or None, what changed). Read with a warning (FT012):
# a rename keeps the run the user meant; a drop says so instead of failing on an unknown flag.
RETIRED_ARGS: dict[str, tuple[str | None, dict | None, str]] = {
    "evaluation_strategy": ("training.eval_strategy", None, "renamed `eval_strategy`"),
    "warmup_ratio": (
        "training.warmup_steps",
        None,
        "transformers 5 folded it into `warmup_steps` (a value below 1 is a ratio of the total steps)",
    ),
    "no_cuda": ("launch.use_cpu", None, "renamed `use_cpu`"),
    "per_gpu_train_batch_size": ("training.per_device_train_batch_size", None, "renamed `per_device_train_batch_size`"),
    "per_gpu_eval_batch_size": ("training.per_device_eval_batch_size", None, "renamed `per_device_eval_batch_size`"),
    "push_to_hub_token": ("training.hub_token", None, "renamed `hub_token`"),
    "group_by_length": (
        "training.train_sampling_strategy",
        {True: "group_by_length", False: "random"},
        "replaced by `train_sampling_strategy`",
    ),
    "save_safetensors": (None, None, "removed in transformers 5: checkpoints are always safetensors"),
    "logging_dir": (
        None,
        None,
        "removed in transformers 5: TensorBoard reads TENSORBOARD_LOGGING_DIR from the environment",
    ),
    "include_tokens_per_second": (None, None, "removed in transformers 5: fsdp-tune's summary reports tokens/s"),
    "use_mps_device": (None, None, "removed in transformers 5 (and fsdp-tune runs on CUDA GPUs or CPU)"),
    "fp16_backend": (None, None, "removed in transformers 5: fp16 uses torch AMP"),
}

TRAINER_CHECKPOINTING: dict[str, str] = {
    "activation_checkpointing": "training.gradient_checkpointing",
    "activation_checkpointing_kwargs": "training.gradient_checkpointing_kwargs",
}

FLAG_ALIASES: dict[str, str] = {
    "max_seq_length": "data.max_seq_len",
    "max_length": "data.max_seq_len",  # SFTConfig's name: one place for one setting
    "packing": "data.packing",
    "dataset_text_field": "data.dataset_text_field",
    "train_on_inputs": "data.train_on_prompt",  # axolotl's name for LLaMA-Factory's train_on_prompt
    "use_cpu": "launch.use_cpu",
    "torch_dtype": "model.dtype",
    "bnb_4bit_quant_storage": "quantization.bnb_4bit_quant_storage_dtype",
    "load_in_4bit": "quantization.use_4bit_quantization",
    "load_in_8bit": "quantization.use_8bit_quantization",
    "bnb_4bit_use_double_quant": "quantization.use_nested_quant",
    "use_parallelism_config": "parallelism.enabled",
    # the Transformers FSDP2 guide's sizes as DistributedConfig spells them, and expert parallelism's other names
    # (Megatron's expert_model_parallel_size, vLLM/SGLang's expert_parallel_size); under --use_parallelism_config
    "fsdp_size": "parallelism.dp_shard_size",
    "ep_size": "parallelism.ep_size",
    "tp_size": "parallelism.tp_size",
    "expert_parallel_size": "parallelism.ep_size",
    "expert_model_parallel_size": "parallelism.ep_size",
    "attn_implementation": "model.attn_implementation",
    "streaming": "data.dataset_streaming",  # TRL's DatasetMixtureConfig: stream every dataset (rules/data.py)
    # transformers 5's names of the Trainer's gradient checkpointing (TrainingArguments.activation_checkpointing):
    # one setting under either name (two values in one place: FT014), never confused with FSDP's (fsdp_ prefix)
    **TRAINER_CHECKPOINTING,
}

# Names only TRL's scripts read (trl/scripts/utils.py ScriptArguments, TrlParser): name -> why it has no effect on an
# fsdp-tune run. Dropped with a warning (FT017), on the command line and in a TRL config file alike.
TRL_SCRIPT_ONLY: dict[str, str] = {
    "ignore_bias_buffers": "TRL's dpo.py fix for DDP (it hides bool buffers from DDP's broadcast); FSDP runs "
    "broadcast no buffers that way",
}

# TRL's `--config` file (TrlParser.parse_args_and_config): its `env:` mapping is set in TRL's own process. fsdp-tune
# does not change its environment from a file (FT017 refuses it); the shell or the job file sets those variables.
TRL_ENV_KEY = "env"

# Recipe sections are the RunConfig sections; `training` takes the method's TRL config fields.
RECIPE_SECTIONS = ("launch", "fsdp", "parallelism", "model", "data", "lora", "quantization", "run", "training")
# Keys a recipe takes at its top level besides the sections: TRL's dataset mixture, the training method and its
# rewards.
RECIPE_TOP_KEYS = {"datasets": "data.datasets", "method": "run.method", "reward_funcs": "run.reward_funcs"}
