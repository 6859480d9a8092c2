"""The typed, frozen launch config that every reader and flag normalizes into.

Each section is a frozen dataclass; field metadata carries what a value may be (`choices`) so that
coercion and enum checks are driven by this one table. `RunConfig.origins` remembers, for every
value that was set, how the user spelled the key and where it came from (file:line or flag).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from fsdp_tune.config.lora_fields import PeftSettings
from fsdp_tune.config.methods import METHODS, SFT, fields_of

WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT")
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
FLOAT_DTYPES = ("bfloat16", "float16", "float32")
QUANT_STORAGE = ("bfloat16", "float16", "float32", "uint8", "int8", "float64")
QUANT_TYPES = ("nf4", "fp4")
CHAT_TEMPLATES = ("chatml", "zephyr", "none")
DATASET_FORMATS = ("auto", "text", "messages", "prompt_completion", "alpaca", "sharegpt")
DATASET_FORMATS += ("preference", "preference_implicit", "unpaired", "ranked", "prompt_only")  # sources/ reads them
MASK_FALLBACKS = ("split", "locate", "error")
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
LOADINGS = ("auto", "sharded", "transformers")  # how the weights reach the ranks (decide/loading.py)
REFERENCES = ("adapter", "base")  # DPO/KTO's reference with a starting adapter: a frozen copy of it, or the base


def _f(default: Any, *, choices: tuple[str, ...] | None = None, kind: str | None = None) -> Any:
    return field(default=default, metadata={"choices": choices, "kind": kind})


@dataclass(frozen=True)
class LaunchSettings:
    """How many processes on how many machines, and how they meet (accelerate's top-level keys)."""

    num_processes: int = _f(1)  # total over all machines, as in accelerate
    num_machines: int = _f(1)
    machine_rank: int = _f(0)
    main_process_ip: str | None = _f(None, kind="str")
    main_process_port: int = _f(29500)
    rdzv_backend: str = _f("static", choices=RDZV_BACKENDS)
    mixed_precision: str = _f("no", choices=MIXED_PRECISION)
    use_cpu: bool = _f(False)
    max_restarts: int = _f(0)
    distributed_type: str = _f("FSDP", kind="str")
    # what `accelerate launch` turns into the ranks' environment (see plan.rank_env)
    gpu_ids: str | None = _f(None, kind="str")  # "all", or "0,1,2,3": CUDA_VISIBLE_DEVICES
    enable_cpu_affinity: bool = _f(False)
    accelerate_debug: bool = _f(False)  # accelerate's `debug`: checks that collectives line up
    dynamo_backend: str = _f("no", kind="str")
    dynamo_mode: str = _f("default", kind="str")
    dynamo_use_fullgraph: bool = _f(False)
    dynamo_use_dynamic: bool = _f(False)
    dynamo_use_regional_compilation: bool = _f(False)

    @property
    def nproc_per_node(self) -> int:
        return max(self.num_processes // max(self.num_machines, 1), 1)


@dataclass(frozen=True)
class FsdpSettings:
    """FSDP settings under their FSDP2 names; the FSDP1-only keys are kept so rules can speak of them."""

    version: int = _f(2)
    reshard_after_forward: bool = _f(True)
    cpu_offload: bool = _f(False)
    auto_wrap_policy: str = _f("TRANSFORMER_BASED_WRAP", choices=WRAP_POLICIES)
    transformer_layer_cls_to_wrap: tuple[str, ...] = _f((), kind="list")
    min_num_params: int = _f(0)
    state_dict_type: str = _f("SHARDED_STATE_DICT", choices=STATE_DICT_TYPES)
    cpu_ram_efficient_loading: bool = _f(True)
    activation_checkpointing: bool = _f(False)
    # FSDP1-only; None when the user did not set them.
    sharding_strategy: str | None = _f(None, choices=SHARDING_STRATEGIES)
    backward_prefetch: str | None = _f(None, choices=BACKWARD_PREFETCH)
    forward_prefetch: bool | None = _f(None, kind="bool")
    sync_module_states: bool | None = _f(None, kind="bool")
    use_orig_params: bool | None = _f(None, kind="bool")
    activation_checkpointing_offload: bool = _f(False)
    xla: bool = _f(False)


@dataclass(frozen=True)
class ParallelismSettings:
    """accelerate's ParallelismConfig; `enabled` is --use_parallelism_config (or a YAML section)."""

    enabled: bool = _f(False)
    dp_replicate_size: int = _f(1)
    dp_shard_size: int | None = _f(None, kind="int")  # None: the rest of the world
    tp_size: int = _f(1)
    cp_size: int = _f(1)
    cp_backend: str = _f("torch", choices=("torch",))
    cp_comm_strategy: str = _f("allgather", choices=("allgather", "alltoall"))
    sp_size: int = _f(1)
    sp_backend: str = _f("deepspeed", choices=("deepspeed",))
    sp_seq_length: int | None = _f(None, kind="int")
    sp_seq_length_is_variable: bool = _f(True)
    sp_attn_implementation: str | None = _f(None, kind="str")
    # transformers' DistributedConfig(ep_size): experts split over ep_size ranks inside the dp_shard (fsdp_size)
    # dimension, not a dimension of its own (the world stays dp_replicate x dp_shard x tp); accelerate has no such key
    ep_size: int = _f(1)

    SIZES = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")


@dataclass(frozen=True)
class ModelSettings:
    model_name_or_path: str | None = _f(None, kind="str")
    model_revision: str | None = _f(None, kind="str")  # a branch, tag or commit of the model (TRL's name)
    use_flash_attn: bool = _f(False)
    attn_implementation: str | None = _f(None, kind="str")
    dtype: str | None = _f(None, choices=("bfloat16", "float16", "float32", "auto"))
    trust_remote_code: bool = _f(False)
    use_unsloth: bool = _f(False)
    loading: str = _f("auto", choices=LOADINGS)
    # a run's adapter to start from: the policy's start; DPO/KTO's reference unless `reference: base` (adapter_start.py)
    adapter: str | None = _f(None, kind="str")
    reference: str = _f("adapter", choices=REFERENCES)
    freeze_vision_tower: bool = _f(True)  # a vision-language model's (config/model_kinds.py); false: LoRA on it too
    freeze_multi_modal_projector: bool = _f(True)  # false: the projector trained whole (LLaMA-Factory's names)


@dataclass(frozen=True)
class DataSettings:
    dataset_name: str | None = _f(None, kind="str")
    splits: tuple[str, ...] = _f(("train", "test"), kind="list")
    chat_template_format: str = _f("none", choices=CHAT_TEMPLATES)
    add_special_tokens: bool = _f(False)
    append_concat_token: bool = _f(False)
    max_seq_len: int = _f(2048)
    dataset_text_field: str = _f("text")
    packing: bool = _f(False)
    # what the data is and where it is (TRL's ScriptArguments / DatasetMixtureConfig spellings where TRL has one)
    dataset_format: str = _f("auto", choices=DATASET_FORMATS)
    dataset_columns: dict[str, str] | None = _f(None, kind="map")  # logical field -> column
    dataset_roles: dict[str, str] | None = _f(None, kind="map")  # ShareGPT speaker -> role
    dataset_config: str | None = _f(None, kind="str")  # load_dataset(name=...)
    dataset_train_split: str | None = _f(None, kind="str")  # None: splits[0]
    dataset_test_split: str | None = _f(None, kind="str")  # None: splits[1]
    data_files: Any = _f(None, kind="files")
    data_dir: str | None = _f(None, kind="str")
    datasets: tuple[dict[str, Any], ...] | None = _f(None, kind="records")  # a mixture, TRL's `datasets:`
    test_split_size: float | None = _f(None, kind="float")  # held-out share carved from the training rows
    dataset_streaming: bool = _f(False)
    # the loss: answers only for chat-like formats unless train_on_prompt
    train_on_prompt: bool = _f(False)
    mask_fallback: str = _f("split", choices=MASK_FALLBACKS)  # templates that re-render earlier turns


@dataclass(frozen=True)
class LoraSettings:
    use_peft_lora: bool = _f(False)
    lora_r: int = _f(64)
    lora_alpha: float = _f(16.0)
    lora_dropout: float = _f(0.1)
    lora_target_modules: tuple[str, ...] = _f(
        ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "up_proj", "gate_proj"), kind="list"
    )
    use_dora: bool = _f(False)
    use_loftq: bool = _f(False)


@dataclass(frozen=True)
class QuantizationSettings:
    use_4bit_quantization: bool = _f(False)
    use_8bit_quantization: bool = _f(False)
    use_nested_quant: bool = _f(False)
    bnb_4bit_compute_dtype: str = _f("float16", choices=FLOAT_DTYPES)
    bnb_4bit_quant_type: str = _f("nf4", choices=QUANT_TYPES)
    # None: follow the dtype the model is loaded in (the only value that FSDP can shard correctly)
    bnb_4bit_quant_storage_dtype: str | None = _f(None, choices=QUANT_STORAGE)

    @property
    def enabled(self) -> bool:
        return self.use_4bit_quantization or self.use_8bit_quantization


@dataclass(frozen=True)
class RunSettings:
    """fsdp-tune's own run options (not SFTConfig fields)."""

    use_reentrant: bool = _f(False)
    overwrite_output_dir: bool = _f(False)
    save_on_interrupt: bool = _f(True)
    skip_memory_check: bool = _f(False)  # train launches even when the plan's peak does not fit the GPUs here
    method: str = _f(SFT, choices=METHODS)  # the training method (config/methods.py): a recipe's top-level `method:`
    # GRPO's rewards (rewards/resolve.py: built-ins, file.py:fn, pkg.mod.fn, a reward model); top-level in a recipe
    reward_funcs: tuple[str, ...] = _f((), kind="list")
    # GRPO's generation on the FSDP2 policy: "gathered" (the whole model all-gathered once per generation), "sharded"
    # (every unit all-gathered again for each token), "auto" (gathered where the plan finds room: planner/generating.py)
    grpo_generation: str = _f("auto", choices=("auto", "sharded", "gathered"))


def training_fields(method: str = SFT) -> dict[str, dict[str, Any]]:
    """The method's TRL config fields (SFTConfig's by default: kind, default and, for a choice-valued field, its
    values) as data: see scripts/gen_training_fields.py and config/methods.py."""
    return fields_of(method)


def attention_implementations() -> tuple[str, ...]:
    """The `attn_implementation` names the installed transformers registers (a Hub kernel `org/repo` besides)."""
    from fsdp_tune.config.methods import table

    return tuple(table().get("attn_implementation", ()))


@dataclass(frozen=True)
class TrainingSettings:
    """The method's config fields the user set (SFTConfig's for SFT); everything else keeps TRL's default for that
    method (DPOConfig's learning_rate is 1e-6, KTOConfig samples sequentially)."""

    args: dict[str, Any] = field(default_factory=dict)
    method: str = SFT  # RunSettings.method, whose config's defaults `get` returns

    def get(self, name: str) -> Any:
        if name in self.args:
            return self.args[name]
        spec = training_fields(self.method).get(name)
        return spec["default"] if spec else None

    def is_set(self, name: str) -> bool:
        return name in self.args


@dataclass(frozen=True)
class Origin:
    """Where a value came from: the key as the user wrote it, and `file:line` or `flag`."""

    key: str
    source: str

    def __str__(self) -> str:
        return f"{self.key} ({self.source})"


@dataclass(frozen=True)
class Assignment:
    """One raw setting before coercion: canonical `section.field`, the value as written, where from."""

    path: str
    value: Any
    origin: Origin


SECTIONS: dict[str, type] = {
    "launch": LaunchSettings,
    "fsdp": FsdpSettings,
    "parallelism": ParallelismSettings,
    "model": ModelSettings,
    "data": DataSettings,
    "lora": LoraSettings,
    "quantization": QuantizationSettings,
    "run": RunSettings,
}


@dataclass(frozen=True)
class RunConfig:
    launch: LaunchSettings = field(default_factory=LaunchSettings)
    fsdp: FsdpSettings = field(default_factory=FsdpSettings)
    parallelism: ParallelismSettings = field(default_factory=ParallelismSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    data: DataSettings = field(default_factory=DataSettings)
    lora: LoraSettings = field(default_factory=LoraSettings)
    quantization: QuantizationSettings = field(default_factory=QuantizationSettings)
    run: RunSettings = field(default_factory=RunSettings)
    training: TrainingSettings = field(default_factory=TrainingSettings)
    peft: PeftSettings = field(default_factory=PeftSettings)  # LoraConfig fields set by PEFT's names
    origins: dict[str, Origin] = field(default_factory=dict, compare=False)
    config_path: str | None = field(default=None, compare=False)

    def origin(self, path: str) -> Origin | None:
        return self.origins.get(path)

    def is_set(self, path: str) -> bool:
        return path in self.origins

    def where(self, path: str) -> str:
        """`key (file:line)` as the user wrote it, or the canonical key with `(default)`."""
        o = self.origins.get(path)
        return str(o) if o else f"{path.split('.', 1)[1]} (default)"

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for resolved.json, --json output and the run manifest."""
        out: dict[str, Any] = {}
        for name in SECTIONS:
            section = getattr(self, name)
            out[name] = {f.name: _plain(getattr(section, f.name)) for f in fields(section)}
        out["training"] = {k: _plain(v) for k, v in self.training.args.items()}
        out["peft"] = {k: _plain(v) for k, v in self.peft.args.items()}
        return out


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def section_fields(section: str) -> dict[str, Any]:
    """name -> dataclass Field of one section (not `training`)."""
    return {f.name: f for f in fields(SECTIONS[section])}
