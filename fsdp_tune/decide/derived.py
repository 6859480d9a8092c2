"""The decisions every reader of a run shares, made here once: the machine the run is for (CPU or GPUs: the one
definition, `runs_on_cpu`), the precision and dtypes, gradient vs activation checkpointing, whether offload acts,
the method's row, the seeds, the model's files and config.json (the door:
sources/model.py). The rank spec (decide/rank.py), the rules, the planner and the trace read them
through one `Derived` (`derive`), never each its own way.

Pure (no torch): the machine comes in as data (decide/machine.py), or not at all for a config judged as written
(validate-config, plan): then only --use_cpu makes a CPU run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fsdp_tune.config.methods import MethodRow, row_of
from fsdp_tune.config.schema import ParallelismSettings, RunConfig
from fsdp_tune.decide.machine import Machine
from fsdp_tune.sources.model import ModelFacts, model_facts

FLOATS = ("bfloat16", "float16", "float32")
DTYPE_OF_PRECISION = {"bf16": "bfloat16", "fp16": "float16", "fp8": "bfloat16", "no": "float32"}
# TRL's own loss switches: read as --train_on_prompt (not value) when --train_on_prompt is not given (FT103)
TRL_LOSS_FLAGS = ("assistant_only_loss", "completion_only_loss")


def runs_on_cpu(cfg: RunConfig, machine: Machine | None = None, asked: bool = False) -> bool:
    """Whether the ranks compute on CPU: asked for (--use_cpu, or `plan --cpu`), or the machine the run is decided
    for has no GPU. `machine` None: the run the config describes, on GPUs unless it says use_cpu (validate-config,
    `plan`, a dry run's memory plan on a laptop)."""
    return asked or cfg.launch.use_cpu or (machine is not None and not machine.cuda)


def compute_precision(cfg: RunConfig) -> str:
    """The run's mixed precision: --bf16/--fp16 flags win over the YAML's mixed_precision (as in TA)."""
    if cfg.training.get("fp16"):
        return "fp16"
    if cfg.training.is_set("bf16"):
        return (
            "bf16"
            if cfg.training.get("bf16")
            else ("no" if cfg.launch.mixed_precision == "bf16" else cfg.launch.mixed_precision)
        )
    return cfg.launch.mixed_precision


def model_dtype(cfg: RunConfig, precision: str | None = None) -> str:
    """The dtype the base model is loaded in (`precision`: compute_precision's answer, when known already)."""
    if cfg.model.dtype and cfg.model.dtype != "auto":
        return cfg.model.dtype
    q = cfg.quantization
    if q.use_4bit_quantization and q.bnb_4bit_quant_storage_dtype in FLOATS:
        return q.bnb_4bit_quant_storage_dtype
    # fp16 keeps fp32 weights: AMP's grad scaler refuses fp16 parameters
    precision = precision or compute_precision(cfg)
    return {"bf16": "bfloat16", "fp16": "float32", "fp8": "bfloat16"}.get(precision, "float32")


def quant_storage(cfg: RunConfig, dtype: str | None = None) -> str:
    """The dtype bitsandbytes packs 4-bit values into: FSDP shards it like any floating parameter (`dtype`:
    model_dtype's answer, when known already)."""
    return cfg.quantization.bnb_4bit_quant_storage_dtype or dtype or model_dtype(cfg)


def gradient_checkpointing(cfg: RunConfig) -> bool:
    """TRL defaults gradient_checkpointing=True, which Trainer refuses next to FSDP's own activation
    checkpointing: the user's explicit choice stands (a rule rejects the clash), TRL's default yields."""
    if cfg.fsdp.activation_checkpointing:
        return False
    return bool(cfg.training.get("gradient_checkpointing"))


def offload_active(cfg: RunConfig, on_cpu: bool) -> bool:
    """cpu_offload acts only on GPU runs: on CPU the parameters already live in host memory, and FSDP2's
    offload policy would try to pin them for a GPU ("Cannot access accelerator device when none is available")."""
    return cfg.fsdp.cpu_offload and not on_cpu


def mesh_sizes(cfg: RunConfig) -> dict[str, int]:
    """Sizes of the device mesh; dp_shard_size None takes what the other dimensions leave."""
    p = cfg.parallelism
    fixed = {name: getattr(p, name) for name in ParallelismSettings.SIZES if name != "dp_shard_size"}
    rest = math.prod(fixed.values())
    shard = p.dp_shard_size if p.dp_shard_size is not None else max(cfg.launch.num_processes // max(rest, 1), 1)
    return {**fixed, "dp_shard_size": shard}


def mesh_active(cfg: RunConfig) -> bool:
    """A ParallelismConfig mesh beyond plain sharding over every rank (HSDP, CP or TP)."""
    p = cfg.parallelism
    return p.enabled and any(v > 1 for k, v in mesh_sizes(cfg).items() if k != "dp_shard_size")


def expert_parallel_size(cfg: RunConfig) -> int:
    """How many ranks split each layer's experts (transformers' DistributedConfig ep_size); 1: no expert
    parallelism. Above 1 the model is sharded at load by from_pretrained(distributed_config=...)
    (decide/loading.py distributed_config), not by accelerate."""
    p = cfg.parallelism
    return p.ep_size if p.enabled and p.ep_size > 1 else 1


def shard_group(cfg: RunConfig) -> int:
    """How many ranks one parameter is sharded over: every rank for plain FSDP; under a mesh accelerate shards
    over the flattened dp_shard x cp dimensions (replicas across dp_replicate hold the same shards)."""
    if not mesh_active(cfg):
        return max(cfg.launch.num_processes, 1)
    sizes = mesh_sizes(cfg)
    return max(sizes["dp_shard_size"] * sizes["cp_size"], 1)


def cp_degree(cfg: RunConfig) -> int:
    """Context parallelism splits every sequence over this many ranks (1 without CP)."""
    return mesh_sizes(cfg)["cp_size"] if mesh_active(cfg) else 1


def fsdp1_unsharded(cfg: RunConfig) -> bool:
    """FSDP1 runs as NO_SHARD: asked for, or clamped to it by torch on a single process."""
    return cfg.fsdp.version == 1 and (cfg.fsdp.sharding_strategy == "NO_SHARD" or cfg.launch.num_processes == 1)


def train_on_prompt(cfg: RunConfig) -> bool:
    """--train_on_prompt (alias --train_on_inputs); else TRL's assistant_only_loss / completion_only_loss
    inverted; else False: chat-like data trains on the answers."""
    if cfg.is_set("data.train_on_prompt"):
        return cfg.data.train_on_prompt
    for name in TRL_LOSS_FLAGS:
        if cfg.training.is_set(name) and cfg.training.get(name) is not None:
            return not cfg.training.get(name)
    return False


def evaluation(cfg: RunConfig) -> bool:
    """The Trainer evaluates: --eval_strategy other than no (TrainingArguments' default)."""
    return cfg.training.get("eval_strategy") not in (None, "no")


@dataclass(frozen=True)
class Derived:
    """Every derived value the rank spec's decisions read, computed once per launch (decide/rank.py passes
    it to each decision instead of each asking the functions above again)."""

    on_cpu: bool  # the ranks compute on CPU: runs_on_cpu
    machine_has_gpus: bool  # False only when the machine decided for has none (a CPU run it did not ask for)
    precision: str  # compute_precision
    model_dtype: str
    quant_storage: str  # meaningful under 4-bit quantization
    gradient_checkpointing: bool  # the Trainer's own (not FSDP's activation checkpointing)
    offload: bool  # cpu_offload that acts (GPU runs only)
    fsdp1_unsharded: bool
    train_on_prompt: bool
    evaluation: bool
    seed: int  # --seed (TRL's default when not given)
    data_seed: int  # --data_seed, else the seed (as the data step has always read them)
    method: MethodRow  # the training method's row (config/methods.py)
    # the model's files and config.json, found once by the door (sources/model.py): what every later stage reads
    model: ModelFacts = field(default_factory=lambda: ModelFacts("absent"))


def derive(cfg: RunConfig, machine: Machine | None = None, cpu: bool = False) -> Derived:
    """The run's decisions on `machine` (None: as the config describes it; `cpu`: a CPU run asked for)."""
    on_cpu = runs_on_cpu(cfg, machine, cpu)
    precision = compute_precision(cfg)
    dtype = model_dtype(cfg, precision)
    seed = int(cfg.training.get("seed"))
    return Derived(
        on_cpu=on_cpu,
        machine_has_gpus=machine is None or machine.cuda,
        precision=precision,
        model_dtype=dtype,
        quant_storage=quant_storage(cfg, dtype),
        gradient_checkpointing=gradient_checkpointing(cfg),
        offload=offload_active(cfg, on_cpu),
        fsdp1_unsharded=fsdp1_unsharded(cfg),
        train_on_prompt=train_on_prompt(cfg),
        evaluation=evaluation(cfg),
        seed=seed,
        data_seed=int(cfg.training.get("data_seed") or seed),
        method=row_of(cfg.run.method),
        model=model_of(cfg),
    )


def model_of(cfg: RunConfig) -> ModelFacts:
    """The model's files and config.json, by the one key every stage uses (the name and its revision): derive's,
    and the plan's when no rank spec was decided (`fsdp-tune plan`)."""
    return model_facts(cfg.model.model_name_or_path, cfg.model.model_revision)
