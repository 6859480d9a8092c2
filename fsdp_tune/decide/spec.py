"""The rank spec: every decision a rank executes, made once on the launcher side (see rank.py).

Plain, frozen, typed data. It is written to OUTPUT_DIR/fsdp_tune_resolved.json, printed by `train --dry_run`
(`--dry_run --json` prints it whole), and the worker reads nothing else: no rank re-decides the backend,
a dtype, checkpointing, the seed, whether it evaluates, how the model loads or the `fsdp_config` that
Transformers receives. Because GPU decisions are data here, they are tested as tables without a GPU
(tests/unit/test_rank_spec.py); every field is read by the worker or shown by the plan
(tests/unit/test_spec_walk.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from fsdp_tune.config.lora_fields import LoraSpec
from fsdp_tune.config.methods import DataKind, Head, Truncation
from fsdp_tune.errors import UsageError
from fsdp_tune.rewards.resolve import RewardSpec
from fsdp_tune.runfiles import RESOLVED_NAME, resolved_name
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.model import ModelFacts
from fsdp_tune.typed import from_plain, to_plain

SPEC_VERSION = 9  # 5: a Source no longer carries what the pre-flight counted (decide/datafiles.py Counted);
# 6: GrpoSpec `grpo` became GenerationSpec `generating` (every generating method's); 7: Loading.distributed_config
# (transformers' DistributedConfig sizes under expert parallelism); 8: `lora` a LoraSpec, not LoraConfig's kwargs,
# `parallelism` a Mesh, not ParallelismConfig's kwargs, and the MixedPrecisionPolicy dtypes a MixedPrecision; 9:
# `trainer_args` a TrainerArgs and the fsdp_configs FsdpConfigs, not their kwargs; fsdp_version, precision and
# checkpointing read from them, no longer fields; Loading.distributed_config a DistributedSizes


@dataclass(frozen=True)
class World:
    """How many ranks on how many machines, and how they meet (torchrun's arguments)."""

    world_size: int
    nnodes: int
    nproc_per_node: int
    node_rank: int
    master_addr: str
    master_port: int
    rdzv_backend: str
    standalone: bool  # one machine, no port asked for: torchrun picks a free port
    max_restarts: int


@dataclass(frozen=True)
class MixedPrecision:
    """FSDP2's MixedPrecisionPolicy, its dtypes by name (the spec is JSON): the QLoRA storage policy
    (RankSpec.fsdp_mixed_precision) and the sharded builder's (ShardedPlan.mp_policy), decided on the launcher."""

    param_dtype: str  # the dtype parameters are all-gathered and computed in
    reduce_dtype: str  # the dtype gradients are reduce-scattered in
    output_dtype: str  # the dtype a unit's forward outputs are cast to

    @classmethod
    def every(cls, dtype: str) -> MixedPrecision:
        return cls(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)

    def kwargs(self) -> dict[str, str]:
        """MixedPrecisionPolicy's arguments by name (each rank turns the names into torch dtypes)."""
        return {"param_dtype": self.param_dtype, "reduce_dtype": self.reduce_dtype, "output_dtype": self.output_dtype}


@dataclass(frozen=True)
class Mesh:
    """The device mesh: accelerate's ParallelismConfig as every rank builds it (worker/training/config.py
    parallelism_config names each field); decided in decide/rank.py mesh, the sizes the rules checked (FT044)."""

    dp_replicate_size: int  # HSDP's replicas
    tp_size: int
    cp_size: int  # context parallelism: the ranks one sequence is split over
    dp_shard_size: int  # what the other dimensions leave of the world, unless set
    cp_comm_strategy: Literal["allgather", "alltoall"] | None = None  # the ring's K/V rotation; None without cp

    def sizes(self) -> dict[str, int]:
        """Each dimension's size by accelerate's name, in the order the plan shows them."""
        return {
            "dp_replicate_size": self.dp_replicate_size,
            "tp_size": self.tp_size,
            "cp_size": self.cp_size,
            "dp_shard_size": self.dp_shard_size,
        }


@dataclass(frozen=True)
class FsdpConfig:
    """Transformers' `fsdp_config` as TrainingArguments reads it (decide/trainer.py fsdp_config decided it): the
    Trainer's on the run's loading path (TrainerArgs.fsdp_config) and the transformers path's under sharded loading
    (Loading.transformers_fsdp_config). `kwargs()` is the dict Transformers receives."""

    version: int  # 1 or 2
    cpu_offload: bool
    auto_wrap_policy: str  # TRANSFORMER_BASED_WRAP | SIZE_BASED_WRAP | NO_WRAP
    state_dict_type: str
    cpu_ram_efficient_loading: bool
    activation_checkpointing: bool  # FSDP's activation checkpointing (accelerate's checkpoint wrappers)
    reshard_after_forward: bool | str  # FSDP2: a bool; FSDP1: its sharding strategy's name (FULL_SHARD, NO_SHARD...)
    # FSDP1's, as the user set them (use_orig_params false for an unsharded unit); None: not passed
    backward_prefetch: str | None = None
    forward_prefetch: bool | None = None
    use_orig_params: bool | None = None
    sync_module_states: bool | None = None
    transformer_layer_cls_to_wrap: list[str] | None = None  # a vision model's layer classes, both towers'
    min_num_params: int | None = None  # SIZE_BASED_WRAP's

    def kwargs(self) -> dict[str, Any]:
        """The fsdp_config dict by Transformers' names (None: left out, Transformers' default)."""
        layers = self.transformer_layer_cls_to_wrap
        named = {
            "version": self.version,
            "cpu_offload": self.cpu_offload,
            "auto_wrap_policy": self.auto_wrap_policy,
            "state_dict_type": self.state_dict_type,
            "cpu_ram_efficient_loading": self.cpu_ram_efficient_loading,
            "activation_checkpointing": self.activation_checkpointing,
            "reshard_after_forward": self.reshard_after_forward,
            "backward_prefetch": self.backward_prefetch,
            "forward_prefetch": self.forward_prefetch,
            "use_orig_params": self.use_orig_params,
            "sync_module_states": self.sync_module_states,
            "transformer_layer_cls_to_wrap": list(layers) if layers is not None else None,
            "min_num_params": self.min_num_params,
        }
        return {k: v for k, v in named.items() if v is not None}


@dataclass(frozen=True)
class DistributedSizes:
    """transformers' DistributedConfig under expert parallelism (decide/loading.py distributed_config): FSDP over
    fsdp_size ranks, the experts split over ep_size of them."""

    fsdp_size: int
    ep_size: int

    def kwargs(self) -> dict[str, int]:
        return {"fsdp_size": self.fsdp_size, "ep_size": self.ep_size}


# what kwargs() names besides the typed fields (precision's), and the older names of a typed field: none is a key of
# TrainerArgs.trl_args
_DERIVED_NAMES = frozenset({"bf16", "fp16", "gradient_checkpointing", "gradient_checkpointing_kwargs"})


@dataclass(frozen=True)
class TrainerArgs:
    """The method's TRL config as every rank builds it, `config_class(**kwargs())` (SFTConfig for SFT: worker/
    training/config.py), decided by decide/trainer.py: the values fsdp-tune decides, typed, and the user's other
    training settings by TRL's names in `trl_args`, kept to the fields of the method's config (the installed TRL's,
    training_fields.json) and of their kinds. Each key is said once: no key of trl_args is a typed field. A typed
    field None is not passed (the config's default; or the method's config has no such field)."""

    output_dir: str
    precision: Literal["no", "bf16", "fp16", "fp8"]  # mixed precision: kwargs()' bf16 (fp8 too) and fp16
    use_cpu: bool
    fsdp: bool  # false when transformers sharded the model at load (expert parallelism): accelerate's FSDP off
    fsdp_config: FsdpConfig  # on the run's loading path (sharded: NO_WRAP, the builder made the units)
    activation_checkpointing: bool  # the Trainer's (transformers 5's name for gradient_checkpointing)
    activation_checkpointing_kwargs: dict[str, Any] | None = None  # use_reentrant and the user's
    ddp_backend: str | None = None  # gloo on the CPU, else the user's
    # the data's, where the method's config has the field (DataSpec holds them for rank 0's preparation whatever
    # the method)
    max_length: int | None = None
    packing: bool | None = None
    dataset_text_field: str | None = None
    pad_to_multiple_of: int | str | None = None  # context parallelism's chunks and the user's multiple, else as given
    logging_nan_inf_filter: bool | None = None  # false unless asked: a NaN shows as NaN (not under fp16's scaler)
    report_to: str | list[str] = "none"  # the user's, else none
    remove_unused_columns: bool | None = None  # false for a vision-language model: each row's images reach the collator
    trl_args: dict[str, Any] = field(default_factory=dict)  # the user's other settings, by TRL's names

    def __post_init__(self) -> None:
        said_twice = sorted(set(self.trl_args) & ({f.name for f in fields(self)} | _DERIVED_NAMES))
        if said_twice:
            raise ValueError(f"TrainerArgs.trl_args repeats typed field(s) {', '.join(said_twice)}")

    def kwargs(self) -> dict[str, Any]:
        """The method's config's arguments by TRL's names: exactly what `config_class(**...)` receives."""
        named = {
            "output_dir": self.output_dir,
            "fsdp": self.fsdp,
            "fsdp_config": self.fsdp_config.kwargs(),
            "bf16": self.precision in ("bf16", "fp8"),
            "fp16": self.precision == "fp16",
            "use_cpu": self.use_cpu,
            "max_length": self.max_length,
            "packing": self.packing,
            "dataset_text_field": self.dataset_text_field,
            "activation_checkpointing": self.activation_checkpointing,
            "activation_checkpointing_kwargs": self.activation_checkpointing_kwargs,
            "ddp_backend": self.ddp_backend,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "logging_nan_inf_filter": self.logging_nan_inf_filter,
            "report_to": self.report_to,
            "remove_unused_columns": self.remove_unused_columns,
        }
        return {**{k: v for k, v in named.items() if v is not None}, **self.trl_args}

    def on(self, fsdp_config: FsdpConfig | None) -> TrainerArgs:
        """These arguments with another fsdp_config (None: as they are)."""
        return self if fsdp_config is None else replace(self, fsdp_config=fsdp_config)


def recorded_trainer_kwargs(plain: dict[str, Any]) -> dict[str, Any]:
    """The trainer's arguments from a run's recorded rank spec (its `trainer_args`, as JSON); a spec older than
    TrainerArgs (SPEC_VERSION 9) recorded the arguments themselves."""
    try:
        return from_plain(TrainerArgs, plain).kwargs()
    except (TypeError, ValueError):
        return dict(plain)


def recorded_fsdp_version(plain: dict[str, Any]) -> int:
    """The FSDP version a run's recorded rank spec (as JSON) says: its trainer's fsdp_config's, both before and
    since TrainerArgs (a spec older than 9 said it as `fsdp_version` too). KeyError, TypeError or ValueError when
    the record does not say."""
    try:
        return int(plain["trainer_args"]["fsdp_config"]["version"])
    except (KeyError, TypeError, ValueError):
        return int(plain["fsdp_version"])


@dataclass(frozen=True)
class VisionSpec:
    """A vision-language model's decisions (decide/vision.py): its family's row (config/model_kinds.py), what trains
    besides the language model, and how every rank runs the vision tower's collectives each step."""

    family: str  # the row's model_type
    tower: str  # the vision tower's module path
    projector: str  # the projector's module path
    train_tower: bool  # --freeze_vision_tower false: the tower trains too (LoRA on its linear layers)
    train_projector: bool  # --freeze_multi_modal_projector false: the projector trains whole
    # "dummy_image": a batch without images gets one tiny image whose tokens sit past every row's end (no row
    # attends to them, none is in the loss), so every rank runs the vision tower, and its FSDP all-gathers, every
    # step (worker/data/vision_collate.py)
    guard: Literal["dummy_image", "none"] = "dummy_image"


@dataclass(frozen=True)
class Quantization:
    """bitsandbytes' 4-bit quantization, as the ranks' BitsAndBytesConfig takes it (worker/loading/pretrained.py
    quantization_config; dtypes by name: the spec is JSON). QLoRA's settings (config/schema.py) decided once."""

    bnb_4bit_quant_type: str  # nf4 | fp4
    bnb_4bit_compute_dtype: str  # the dtype the 4-bit matmuls compute in
    bnb_4bit_use_double_quant: bool  # --use_nested_quant: the absmax constants quantized too
    bnb_4bit_quant_storage: str  # the dtype the packed values are stored in (FSDP shards it like a float)
    load_in_4bit: bool = True


@dataclass(frozen=True)
class ModelSpec:
    name_or_path: str  # what from_pretrained reads (a builtin model's folder once materialised)
    requested: str  # as the user named it (builtin:tiny-llama, a hub id, a folder)
    dtype: str  # the dtype the base model is loaded in
    attn_implementation: str | None  # None: transformers picks (sdpa if the class supports it, else eager)
    trust_remote_code: bool
    quantization: Quantization | None  # None when not quantized
    chat_template: str | None  # a template of config/templates.py, applied to the tokenizer
    revision: str | None = None  # the model's branch, tag or commit (--model_revision)
    adapter: str | None = None  # a trained adapter's folder the policy starts from (--adapter), absolute
    # DPO/KTO's reference: "base" (the base model: a fresh adapter's start) or "adapter" (a frozen copy of the
    # starting adapter); on the sharded path it is the frozen "ref" adapter either way (worker/loading/reference.py)
    reference: Literal["base", "adapter"] = "base"
    # the model's kind (config/model_kinds.py): its Auto class, a processor or not
    kind: Literal["causal_lm", "vision_language"] = "causal_lm"
    vision: VisionSpec | None = None  # a vision-language model's decisions
    # where the model's files are and its config.json, as the door found them once (sources/model.py); the
    # pre-flight and the trace read them here, never the file again
    facts: ModelFacts = field(default_factory=lambda: ModelFacts("absent"))


@dataclass(frozen=True)
class ShardedPlan:
    """What the sharded model builder (worker/loading/sharded.py) applies that accelerate applies on the
    transformers path, decided as accelerate 1.15 decides it (decide/loading.py sharded_plan)."""

    layer_cls: tuple[str, ...]  # the classes made FSDP units; empty: the model's _no_split_modules
    reshard_after_forward: bool
    activation_checkpointing: bool  # FSDP activation checkpointing (fsdp2_apply_ac)
    activation_checkpointing_offload: bool
    cpu_offload: bool
    mp_policy: MixedPrecision | None  # None: FSDP2's default
    upcast_trainable: bool  # trainable parameters in fp32 under mixed precision (not with 4-bit weights)
    may_fall_back: bool  # --loading auto: a rank that finds the model needs from_pretrained falls back; else stops


@dataclass(frozen=True)
class Loading:
    """How the weights reach the ranks (decide/loading.py): "sharded" (each rank reads only its shards,
    worker/loading/sharded.py) or "transformers" (from_pretrained on every rank)."""

    path: Literal["transformers", "sharded"] = "transformers"
    why: str | None = None  # why the run takes the transformers path, when sharded loading does not apply
    sharded: ShardedPlan | None = None  # on the sharded path: what the builder applies
    # on the sharded path, the transformers path's fsdp_config: the units the builder makes follow it, and a rank
    # that falls back gives it to the Trainer (the Trainer is otherwise told NO_WRAP); None on the transformers path
    transformers_fsdp_config: FsdpConfig | None = None
    # expert parallelism: transformers' DistributedConfig(**distributed_config.kwargs()) given to from_pretrained,
    # which shards the model at load (FSDP2 on its own mesh, experts split over ep_size ranks); the Trainer then
    # neither wraps nor shards it (no accelerate FSDP). None: accelerate's FSDP, as the fsdp_config says
    distributed_config: DistributedSizes | None = None


@dataclass(frozen=True)
class DataSpec:
    """The data every rank trains on: the sources (their format detected from the files on the launcher, or
    on rank 0 for a Hub dataset), how they mix, and what is in the loss. Rank 0 converts and tokenizes once
    (worker/data/prepare.py); the others read its result."""

    dataset_name: str
    splits: tuple[str, ...]
    text_field: str
    max_seq_len: int
    packing: bool
    seed: int  # mixing sources and carving held-out rows: --data_seed, else --seed
    sources: tuple[Source, ...] = ()
    test_split_size: float | None = None  # held-out share carved from the mixed training rows
    mask_fallback: Literal["split", "locate", "error"] = "split"  # chat templates that re-render earlier turns
    peft_text_field: str | None = None  # PEFT's examples path: chats rendered into this text, every token trained
    # how the trainer cuts and packs sequences, as its config reads them (the run's, or TRL's defaults): rank 0
    # encodes the rows to match, and the pre-flight counts what would be cut
    truncation_mode: Literal["keep_start", "keep_end"] = "keep_start"
    packing_strategy: str = "bfd"  # bfd | bfd_split | wrapped (TRL's packing)
    eos_token: str | None = None  # SFTConfig's eos_token; None: the tokenizer's
    num_proc: int | None = None  # --dataset_num_proc: processes rank 0 maps the rows with
    pad_to_multiple_of: int | None = None  # SFTConfig's: batches padded to a multiple (the vision collator's too)


@dataclass(frozen=True)
class SaveSpec:
    """How the adapter leaves the sharded model at the end (and at FULL checkpoints) and comes back on resume
    (worker/saving/save.py): it depends on the FSDP version, so it is decided here and tested as a table. Whether
    checkpoints hold the whole adapter is RankSpec.full_state_dict."""

    # "gather_trainable": FSDP2, every rank all-gathers the trainable tensors only, rank 0 writes them;
    # "fsdp1_units": FSDP1, one unit unsharded at a time, its adapter tensors copied off (worker/saving/fsdp1_units.py)
    final: Literal["gather_trainable", "fsdp1_units"] = "gather_trainable"
    # "local_rows": FSDP2, each rank copies its rows of the saved adapter into its shards where they live (GPU, or
    # pinned host memory under cpu_offload); "fsdp1_units": FSDP1, unit by unit, written back to each shard
    resume: Literal["local_rows", "fsdp1_units"] = "local_rows"
    # how a checkpoint holds the model: "adapter_file" (FULL_STATE_DICT with an adapter: the adapter file `final`
    # writes, and nothing else; accelerate's save_fsdp_model is skipped, whose FULL state dict gathers the whole
    # model under FSDP1, cloned on the GPU for an unsharded unit, and gathers the adapter a second time under FSDP2;
    # the best model comes back from the adapter file as a resume does); "accelerate" (SHARDED_STATE_DICT, or full
    # fine-tuning: accelerate's save_fsdp_model, the shards or the whole model, and its load)
    checkpoint: Literal["adapter_file", "accelerate"] = "accelerate"


@dataclass(frozen=True)
class MethodSpec:
    """The training method as the ranks execute it: its row's traits (config/methods.py), so no rank decides
    anything from the method's name."""

    name: str = "sft"  # the ranks' hook: the TRL config and trainer classes, the data preparation
    data: DataKind = "sft"  # the rows it trains on
    head: Head = "lm"  # "score": a sequence classifier with one number (AutoModelForSequenceClassification)
    reference_adapter: bool = False  # a frozen "ref" adapter beside the policy's (worker/loading/reference.py)
    truncation: Truncation = "sft"  # what the trainer cuts or drops at max_seq_len, as rank 0 counts it


@dataclass(frozen=True)
class Steps:
    """How many rows a step takes, how it ends, and when checkpoints are written: the Trainer reads these from
    trainer_args; here they are typed, with the method's config defaults filled in, for the pre-flight (a resume's
    batch, the disk a run's checkpoints take) and `plan --trace`."""

    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_steps: int = -1
    max_grad_norm: float = 1.0
    optim: str = "adamw_torch_fused"
    save_strategy: Literal["no", "steps", "epoch", "best"] = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None


@dataclass(frozen=True)
class GenerationSpec:
    """What a generating method's ranks need beyond its TRL config (the trainer_args: GRPOConfig, RLOOConfig),
    decided on the launcher (decide/method.py generation_spec)."""

    rewards: tuple[RewardSpec, ...]
    # how completions are generated: "transformers" (generate on the sharded policy, every rank stepping until all
    # are done) | "vllm" (TRL's vLLM backend, colocated, GPU only, never run here: by reading)
    generation: Literal["transformers", "vllm"] = "transformers"
    # generate() keeps every rank stepping until all ranks finish: more than one rank, on the sharded path only
    synced: bool = True
    # transformers' generation on the FSDP2 policy: "gathered" (the whole model all-gathered once per generation,
    # FSDPModule.unshard/reshard: worker/training/generation.py) | "sharded" (every unit all-gathered again per token);
    # --grpo_generation, its "auto" settled on the launcher by the memory plan (planner/generating.py
    # generation_weights)
    weights: Literal["sharded", "gathered", "auto"] = "sharded"
    weights_why: str = ""  # the decision in words, with the memory that decided it (plan, --dry_run)
    # how the policy reaches vLLM: "adapter" (the trained adapter alone, gathered as the final save gathers it; never
    # a merge into the sharded, perhaps 4-bit, base) | None without vLLM
    weight_sync: Literal["adapter"] | None = None
    # the KL term's reference (beta > 0): "off" (none: beta 0) | "adapter_disabled" (the same sharded model with the
    # adapter switched off: the base) | "ref_adapter" (a frozen copy of the starting adapter, --adapter; or of the
    # fresh one, the base, where the trainer copies it whatever beta: the row's copies_reference)
    reference: Literal["off", "adapter_disabled", "ref_adapter"] = "off"
    max_prompt_tokens: int | None = None  # max_seq_len - max_completion_length: longer prompts are left out
    # GRPOConfig's, as it reads them (its defaults when unset): completions per prompt, tokens per completion (the
    # length rewards scale by it)
    num_generations: int | None = 8
    max_completion_length: int | None = 512


@dataclass(frozen=True)
class RankSpec:
    world: World
    device: Literal["cpu", "cuda"]  # where the ranks compute
    backend: str  # the process-group backend string, e.g. "gloo", "nccl", "cuda:nccl,cpu:gloo"
    # collectives time out after this long: --ddp_timeout, TrainingArguments' default filled in (trainer_args has
    # ddp_timeout only where the user set it)
    timeout_s: int
    env: dict[str, str]  # exported to torchrun and every rank, as `accelerate launch` would
    cpu_fsdp_shim: bool  # accelerate's FSDP path on CPU (worker/cpu_fsdp.py)
    trainer_args: TrainerArgs  # SFTConfig(**trainer_args.kwargs()): fsdp_config as Transformers receives it included
    parallelism: Mesh | None  # the device mesh (accelerate's ParallelismConfig), None: plain FSDP
    fsdp_mixed_precision: MixedPrecision | None  # FSDP2's policy for QLoRA, None: accelerate's
    model: ModelSpec
    lora: LoraSpec | None  # None for full fine-tuning
    data: DataSpec
    resume_from_checkpoint: str | None
    checkpoint_on_stop: bool  # a stop request (signal, stop file) ends with a checkpoint
    check_grad_norm: bool  # the NaN guard also watches the gradient norm (not under fp16's scaler)
    loading: Loading  # how the model loads (decide/loading.py)
    evaluation: bool  # the Trainer evaluates (--eval_strategy other than no): the ranks get the held-out rows
    # set_seed before data and model (LoRA's initial values): --seed, TRL's default filled in (trainer_args has seed
    # only where the user set it)
    seed: int
    full_state_dict: bool  # checkpoints hold the whole adapter (FULL_STATE_DICT): fsdp-tune's gather saves them
    method: MethodSpec = field(default_factory=MethodSpec)  # the training method (worker/training/methods.py)
    steps: Steps = field(default_factory=Steps)  # the batch, the end and the checkpoints, typed
    spec_version: int = SPEC_VERSION
    notes: tuple[str, ...] = field(default=())  # decisions worth telling the user (shown by --dry_run)
    # what rank 0 shows people (worker/logs.py, worker/training/progress.py): "live" (a terminal: one progress
    # line redrawn in place), "lines" (a file or a scheduler's log: plain progress lines) or "verbose" (also
    # everything the libraries print); the libraries' output always goes, whole, to OUTPUT_DIR/logs/rank-K.log
    console: Literal["live", "lines", "verbose"] = "lines"
    save: SaveSpec = field(default_factory=SaveSpec)  # how the adapter is saved and reloaded (FSDP version)
    # a generating method's (the row's `generates`: GRPO, RLOO): its rewards, its generation and its reference
    generating: GenerationSpec | None = None

    @property
    def output_dir(self) -> str:
        return self.trainer_args.output_dir

    @property
    def fsdp_config(self) -> FsdpConfig:
        """The Trainer's fsdp_config on the run's loading path."""
        return self.trainer_args.fsdp_config

    @property
    def unit_fsdp_config(self) -> FsdpConfig:
        """The fsdp_config the FSDP units follow: under sharded loading the builder makes them (the Trainer is
        told NO_WRAP), as the transformers path's config says."""
        return self.loading.transformers_fsdp_config or self.fsdp_config

    @property
    def fsdp_version(self) -> int:
        return self.fsdp_config.version

    @property
    def precision(self) -> str:
        """Mixed precision: "no" | "bf16" | "fp16" | "fp8"."""
        return self.trainer_args.precision

    @property
    def checkpointing(self) -> str:
        """What recomputes activations, for the plan: "fsdp" (FSDP's activation checkpointing, as the units'
        fsdp_config says; the sharded builder applies it, loading.sharded) | "gradient" (the Trainer's) | "off"."""
        if self.unit_fsdp_config.activation_checkpointing:
            return "fsdp"
        return "gradient" if self.trainer_args.activation_checkpointing else "off"

    def trainer_args_on(self, path: str | None = None) -> dict[str, Any]:
        """The method's config's arguments (SFTConfig's for SFT) for the model loaded on `path` (None: the run's
        loading path): a rank that fell back from sharded loading trains with the transformers path's fsdp_config
        (decided here, on the launcher)."""
        if path == "transformers":
            return self.trainer_args.on(self.loading.transformers_fsdp_config).kwargs()
        return self.trainer_args.kwargs()

    @property
    def resolved_path(self) -> str:
        return str(Path(self.output_dir) / resolved_name(self.world.node_rank, self.world.nnodes))

    def as_dict(self) -> dict[str, Any]:
        return to_plain(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def from_dict(data: dict[str, Any]) -> RankSpec:
    """A RankSpec from `as_dict()` output (the worker reads resolved.json this way)."""
    if data.get("spec_version") != SPEC_VERSION:
        raise ValueError(
            f"rank spec version {data.get('spec_version')} (this fsdp-tune reads {SPEC_VERSION}): the launcher "
            "and the ranks run different fsdp-tune versions"
        )
    return from_plain(RankSpec, data)


def upgraded(data: dict[str, Any]) -> dict[str, Any]:
    """A run's recorded rank spec (as JSON) of the spec before this one, 8, read as this one, 9: its trainer
    arguments recorded as the kwargs themselves become TrainerArgs (the values fsdp-tune decides by field, bf16/fp16
    as the precision recorded beside them, the user's others in trl_args), and what 9 no longer stores beside them
    (fsdp_version, precision, checkpointing, output_dir: read from trainer_args now) goes. Both fsdp_config dicts
    already held FsdpConfig's fields by name, distributed_config DistributedSizes'. Any other version: as it was."""
    if data.get("spec_version") != 8:
        return data
    out = {k: v for k, v in data.items() if k not in ("fsdp_version", "precision", "checkpointing", "output_dir")}
    args = dict(data["trainer_args"])
    typed = {f.name for f in fields(TrainerArgs)} - {"precision", "trl_args"}
    own = {k: args.pop(k) for k in sorted(typed & set(args))}
    for name in _DERIVED_NAMES:  # bf16/fp16: the recorded precision says them
        args.pop(name, None)
    out["trainer_args"] = {**own, "precision": data["precision"], "trl_args": args}
    out["spec_version"] = 9
    return out


def read_from(run_dir: str | Path) -> RankSpec | None:
    """The rank spec a run executed (machine 0's), for the commands after a run; None for a folder fsdp-tune
    did not train into (a downloaded adapter). A run of the fsdp-tune before this one (spec 8) is read as this one
    (`upgraded`); an older one is refused with what to do (its spec's fields are others: `lora` before 8, the
    generating methods' before 6)."""
    for path in (Path(run_dir) / RESOLVED_NAME, *sorted(Path(run_dir).glob(f"node0-{RESOLVED_NAME}"))):
        if path.exists():
            data = upgraded(json.loads(path.read_text())["spec"])  # the spec before this one is read too
            if data.get("spec_version") != SPEC_VERSION:  # a run of an older fsdp-tune: its spec reads otherwise
                raise UsageError(
                    f"{path} was written by another fsdp-tune version (rank spec {data.get('spec_version')}; this "
                    f"one reads {SPEC_VERSION}): the run's decisions (its base model, dtype, quantization) cannot be "
                    "read back",
                    f"run this command with the fsdp-tune version that trained {run_dir}, or on a copy of the folder "
                    f"without {path.name} (read as a downloaded adapter: --base names its model)",
                )
            return from_dict(data)
    return None
