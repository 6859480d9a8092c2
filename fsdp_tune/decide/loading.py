"""How the weights reach the ranks, decided once on the launcher: "sharded" or "transformers".

sharded (worker/loading/sharded.py): the model is built on the meta device, LoRA applied, the FSDP2 units made, and
every rank reads only its own shard of each parameter from the safetensors files (quantizing only what it keeps
under QLoRA). transformers: from_pretrained on every rank (the whole model in each rank's memory, the whole 4-bit
model on each GPU), then accelerate's fully_shard.

`--loading auto` (the default) takes sharded loading wherever it applies and says why not where it does not;
`--loading sharded` insists (a config it cannot take is refused up front, FT036, and a model a rank finds it cannot
take stops the run); `--loading transformers` keeps from_pretrained. What only a rank can see (a hub model's files,
checkpoint keys the model does not have) is checked there, and an `auto` run then falls back on every rank alike.
Pure: reads the model's config.json as the door found it (`Derived.model`) and its file names; no torch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import DTYPE_OF_PRECISION, Derived, expert_parallel_size, mesh_sizes
from fsdp_tune.decide.spec import DistributedSizes, FsdpConfig, Loading, MixedPrecision, ShardedPlan
from fsdp_tune.decide.vision import layer_classes
from fsdp_tune.sources.model import ModelFacts
from fsdp_tune.sources.moe import has_experts

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
WEIGHT_FILES = (SINGLE_FILE, INDEX_FILE)


EXPERT_PARALLEL = "expert parallelism: transformers shards the model as it loads (DistributedConfig)"


def distributed_config(cfg: RunConfig) -> DistributedSizes | None:
    """transformers' DistributedConfig for an expert-parallel run: FSDP over every rank (fsdp_size: the
    rules keep dp_replicate, tp, cp and sp at 1, FT139), experts split over ep_size of them; None otherwise."""
    ep = expert_parallel_size(cfg)
    if ep == 1:
        return None
    return DistributedSizes(fsdp_size=mesh_sizes(cfg)["dp_shard_size"], ep_size=ep)


def remote_code_reason(trust_remote_code: bool, auto_map: Any) -> str | None:
    """Remote code the model's config points at: the launcher asks it of a config on this machine, a rank of
    one it reads first (worker/loading/files.py)."""
    if trust_remote_code and auto_map:
        return "remote code (auto_map): its modules may make weights that no checkpoint key names"
    return None


def loading_path(cfg: RunConfig, model: ModelFacts) -> tuple[str, str | None]:
    """("sharded" | "transformers", why the run does not load sharded: None when it does); `model`: the model's
    files as the door found them (`Derived.model`)."""
    if cfg.model.loading == "transformers":
        return "transformers", "asked for (--loading transformers)"
    reason = why_not_sharded(cfg, model)
    return ("transformers", reason) if reason else ("sharded", None)


def why_not_sharded(cfg: RunConfig, model: ModelFacts) -> str | None:
    """Why sharded loading cannot take this run (the first reason found), or None when it can."""
    return _setting_reason(cfg) or _model_reason(cfg, model)


def _setting_reason(cfg: RunConfig) -> str | None:
    f, lo = cfg.fsdp, cfg.lora
    if row_of(cfg.run.method).head == "score":
        return (
            f"{cfg.run.method}: a sequence classifier whose score head a causal LM's checkpoint does not hold "
            "(from_pretrained initialises it)"
        )
    if f.version != 2:
        return "FSDP1 wraps an already loaded model into flat parameters (fsdp-tune convert --fsdp2 migrates a config)"
    if not lo.use_peft_lora:
        return "full fine-tuning: sharded loading covers LoRA and QLoRA"
    if f.auto_wrap_policy != "TRANSFORMER_BASED_WRAP":
        return f"auto_wrap_policy {f.auto_wrap_policy}: sharded loading makes TRANSFORMER_BASED_WRAP's units"
    if lo.use_dora:
        return "DoRA initialises its magnitude vectors from the whole base weights"
    if cfg.peft.get("trainable_token_indices"):
        return "trainable_token_indices: PEFT copies the chosen embedding rows from the loaded weights"
    if cfg.quantization.use_8bit_quantization:
        return "8-bit (LLM.int8) weights"
    if expert_parallel_size(cfg) > 1:
        return EXPERT_PARALLEL
    sizes = mesh_sizes(cfg) if cfg.parallelism.enabled else {}
    if sizes.get("tp_size", 1) > 1 or sizes.get("sp_size", 1) > 1:
        return "tensor or sequence parallelism places the weights its own way"
    if cfg.training.get("chat_template_path"):
        return "chat_template_path: SFTTrainer copies that template onto the loaded model, adding embedding rows"
    if cfg.launch.dynamo_backend.lower() != "no":
        return "torch.compile (dynamo_backend) of a model sharded before the Trainer sees it: not yet run"
    return None


def _model_reason(cfg: RunConfig, model: ModelFacts) -> str | None:
    """What the model's own files say, where they are on this machine (else the ranks check)."""
    name = cfg.model.model_name_or_path or ""
    config = model.config
    if config is None:
        if cfg.model.trust_remote_code and name:
            return "trust_remote_code with a model whose config is not on this machine: its code may make weights"
        return None
    remote = remote_code_reason(cfg.model.trust_remote_code, config.get("auto_map"))
    if remote:
        return remote
    if config.get("quantization_config"):
        return "the checkpoint is quantized already (GPTQ/AWQ/bnb/FP8 weights have loaders of their own)"
    for section in (config, config.get("text_config") or {}):
        if has_experts(section):
            return f"{config.get('model_type')} is a mixture of experts: transformers fuses its expert tensors on load"
    folder = Path(model.path or "")
    if model.where == "local" and folder.is_dir() and not any((folder / f).exists() for f in WEIGHT_FILES):
        return f"{name} holds no safetensors weights ({' or '.join(WEIGHT_FILES)})"
    return None


def sharded_plan(cfg: RunConfig, d: Derived, qlora_policy: MixedPrecision | None) -> ShardedPlan:
    """What the sharded model builder applies that accelerate applies on the transformers path, decided as
    accelerate 1.15 decides it: the units (TRANSFORMER_BASED_WRAP's layer classes, the model's _no_split_modules
    when none is named), FSDP activation checkpointing (fsdp2_apply_ac), the MixedPrecisionPolicy (the plugin's:
    the QLoRA storage policy, else every dtype the run's precision, else the default), the offload policy and the
    fp32 upcast of trainable parameters under mixed precision without 4-bit weights (fsdp2_prepare_model)."""
    f = cfg.fsdp
    policy = qlora_policy
    if policy is None and d.precision != "no":
        policy = MixedPrecision.every(DTYPE_OF_PRECISION[d.precision])
    return ShardedPlan(
        layer_cls=layer_classes(cfg, d.model),  # the user's, or a vision-language family's (decide/vision.py)
        reshard_after_forward=f.reshard_after_forward,
        activation_checkpointing=f.activation_checkpointing,
        activation_checkpointing_offload=f.activation_checkpointing_offload and not d.on_cpu,
        cpu_offload=d.offload,
        mp_policy=policy,
        upcast_trainable=d.precision != "no" and not cfg.quantization.use_4bit_quantization,
        may_fall_back=cfg.model.loading == "auto",
    )


def trainer_fsdp_config(fsdp_config: FsdpConfig) -> FsdpConfig:
    """The fsdp_config the Trainer gets for a model sharded already: accelerate must not wrap it again (with
    TRANSFORMER_BASED_WRAP it looks the layer class up by name and finds only FSDP's subclass) nor put
    checkpoint wrappers around sharded layers; the builder did both."""
    return replace(
        fsdp_config,
        auto_wrap_policy="NO_WRAP",
        activation_checkpointing=False,
        transformer_layer_cls_to_wrap=None,
        min_num_params=None,
    )


def decide_loading(cfg: RunConfig, d: Derived, fsdp_config: FsdpConfig, qlora_policy: MixedPrecision | None) -> Loading:
    """The path, why not sharded, and on the sharded path the builder's plan and the transformers path's
    fsdp_config (`fsdp_config`; the Trainer then gets trainer_fsdp_config's)."""
    path, why = loading_path(cfg, d.model)
    if path != "sharded":
        return Loading(path, why, distributed_config=distributed_config(cfg))
    return Loading(path, why, sharded_plan(cfg, d, qlora_policy), transformers_fsdp_config=fsdp_config)


def trainer_fsdp_config_for(loading: Loading, fsdp_config: FsdpConfig) -> FsdpConfig:
    """The Trainer's fsdp_config on the run's loading path."""
    return trainer_fsdp_config(fsdp_config) if loading.sharded is not None else fsdp_config


def describe(loading: Loading) -> str:
    """One line for the launch plan."""
    path, note = loading.path, loading.why
    if path == "sharded":
        return (
            "sharded: each rank reads only its own shards from the safetensors files "
            "(--loading transformers: from_pretrained on every rank)"
        )
    if loading.distributed_config:
        sizes = ", ".join(f"{k}={v}" for k, v in loading.distributed_config.kwargs().items())
        return f"transformers: from_pretrained(distributed_config=DistributedConfig({sizes})) on every rank"
    return f"transformers: from_pretrained on every rank ({note})" if note else "transformers"
