"""The model a rank trains, built from its config.json with fewer decoder layers, the way the ranks build it: the
rank spec (decide/rank.py, on a simulated GPU machine) decides, worker/loading/sharded.py's and units.py's
builders execute (the 4-bit quantizer's modules and packed weights, get_peft_model with SFTTrainer's dtypes and
accelerate's fp32 upcast, accelerate's FSDP2 units and checkpoint wrappers, the MixedPrecisionPolicy, offload and
the device mesh). Everything happens on the meta device; `materialize` then turns every tensor into a FakeTensor
on the `cpu` device inside the trace's FakeTensorMode.

The FSDP2 units are the ones the sharded loading path makes, which are accelerate's own on the transformers path
(fsdp2_prepare_model), so a run that loads with from_pretrained is built the same way here."""

from __future__ import annotations

import copy
import types
from dataclasses import dataclass, field, replace

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import derive
from fsdp_tune.decide.loading import sharded_plan
from fsdp_tune.decide.spec import Mesh, RankSpec, ShardedPlan
from fsdp_tune.sources.moe import has_experts
from fsdp_tune.trace import context


@dataclass
class Built:
    model: object
    layer_classes: tuple
    layers: int  # decoder layers built
    packed: dict = field(default_factory=dict)  # {id(Linear4bit): worker/loading/four_bit.Packed}
    quant_tensors: list = field(default_factory=list)  # the replicated 4-bit quant state, filled by materialize
    offload: bool = False
    mesh: Mesh | None = None
    parallelism_config: object = None  # accelerate's ParallelismConfig: the device mesh FSDP and the cp ring share
    dtype: str = "bfloat16"  # the base model's dtype (what 4-bit weights are quantized from)
    notes: list[str] = field(default_factory=list)  # what the build stood in for


def depth(spec: RankSpec) -> int:
    """Decoder layers of the model (its config's num_hidden_layers, as the rank spec carries it)."""
    return int(_text(_config(spec))["num_hidden_layers"])


def _config(spec: RankSpec) -> dict:
    """The model's config.json as the door found it at decide time (`ModelSpec.facts`); `plan --trace` plans first,
    and the plan refuses a model whose config is not on this machine (planner/plan.py) before this is read."""
    config = spec.model.facts.config
    if config is None:
        raise FileNotFoundError(spec.model.requested)
    return copy.deepcopy(config)


def _text(data: dict) -> dict:
    return data["text_config"] if isinstance(data.get("text_config"), dict) else data


def truncated_config(spec: RankSpec, layers: int):
    """The model's config with `layers` decoder layers (per-layer lists cut to match)."""
    from transformers import AutoConfig

    data = _config(spec)
    text = _text(data)
    text["num_hidden_layers"] = layers
    for key, value in list(text.items()):
        if isinstance(value, list) and key.endswith("layer_types"):
            text[key] = value[:layers]
    return AutoConfig.for_model(**data)


def unit_plan(spec: RankSpec, cfg: RunConfig) -> ShardedPlan:
    """The sharded builder's plan: the spec's own, or the one accelerate follows on the transformers path."""
    if spec.loading.sharded is not None:
        return spec.loading.sharded
    return sharded_plan(cfg, derive(cfg, cpu=spec.device == "cpu"), spec.fsdp_mixed_precision)


def build(spec: RankSpec, cfg: RunConfig, layers: int) -> Built:
    """The FSDP2 model with `layers` decoder layers, every base parameter on the meta device."""
    from fsdp_tune.worker.loading import sharded as sharded_load
    from fsdp_tune.worker.loading import units as sharded_units

    plan = unit_plan(spec, cfg)
    notes = []
    attention = spec.model.attn_implementation
    if attention and attention.startswith("flash"):  # flash-attn is a CUDA package: SDPA's flash kernel saves alike
        spec = replace(spec, model=replace(spec.model, attn_implementation="sdpa"))
        notes.append(f"{attention} stood in by SDPA (both save q, k, v, the output and the fp32 logsumexp)")
    if has_experts(_text(_config(spec))):
        notes.append(
            "mixture of experts: transformers' grouped_mm experts run every token's top-k rows (tokens x top_k) "
            "through the stacked experts; how routing splits them among experts is data the trace has not, and no "
            "tensor's size depends on it"
        )
    model, packed = _meta_model(spec, truncated_config(spec, layers))
    quantized = bool(packed)
    if spec.lora is not None:
        model = sharded_load._with_lora(model, spec, quantized, plan.upcast_trainable, 42)
    elif plan.upcast_trainable:
        _upcast_trainable(model)
    classes = sharded_units.layer_classes(model, plan.layer_cls or getattr(model, "_no_split_modules", None) or [])
    if plan.activation_checkpointing:
        sharded_units.apply_ac(model, classes, plan.activation_checkpointing_offload)
    mesh = spec.parallelism or Mesh(dp_replicate_size=1, tp_size=1, cp_size=1, dp_shard_size=spec.world.world_size)
    kwargs, pc = _fsdp_kwargs(replace(spec, device="cpu", loading=replace(spec.loading, sharded=plan)), mesh)
    sharded_units.apply_fsdp2(model, classes, **kwargs)
    if spec.checkpointing == "gradient":
        _trainer_checkpointing(model, spec)
    if context.cp_size(spec) > 1:
        context.attach_hooks(model)
    built = Built(model, classes, layers, packed, offload=bool(plan.cpu_offload), mesh=mesh, dtype=spec.model.dtype)
    built.parallelism_config, built.notes = pc, notes
    return built


def check_sharding(built: Built, world_size: int) -> str | None:
    """What is wrong, if anything, with how the built model is sharded: the process group's size, each unit's FSDP
    mesh (dp_shard ranks, and dp_replicate under HSDP) and a layer's local shard against the run's. A peak traced
    on a model sharded otherwise would be another run's: trace_at refuses to report one."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    mesh = built.mesh
    replicate = mesh.dp_replicate_size if mesh else 1
    shard = mesh.dp_shard_size * mesh.cp_size if mesh else world_size  # accelerate: dp_shard x cp
    if dist.get_world_size() != world_size:
        return f"the fake process group has {dist.get_world_size()} ranks, the run {world_size}"
    for name, module in built.model.named_modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        if group is None:
            continue
        info = group.mesh_info
        sizes = (info.shard_mesh_size, getattr(info, "replicate_mesh_size", 1))
        if sizes != (shard, replicate):
            unit = name or "root"
            return f"unit {unit} shards over {sizes[0]} ranks x {sizes[1]} replicas, the run's {shard} x {replicate}"
        p = group.fsdp_params[0].sharded_param if group.fsdp_params else None
        if p is not None and p.dim() and p.to_local().shape[0] != -(-p.shape[0] // shard):
            return f"{name}: a shard of {p.to_local().shape[0]} rows of {p.shape[0]}, not 1/{shard}"
    return None


def _meta_model(spec: RankSpec, config):
    """worker/loading/sharded.py's _meta_model without a checkpoint folder: from_config under init_empty_weights, tied,
    4-bit modules in place with packed meta weights. Returns (model, packed)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from fsdp_tune.worker.loading import sharded as sharded_load

    m = spec.model
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(
            config, dtype=getattr(torch, m.dtype), attn_implementation=m.attn_implementation
        )
    model.tie_weights()
    quantizer, packed = sharded_load._quantize_meta(model, spec)
    model.config.use_cache = False
    if quantizer is not None:
        quantizer.postprocess_model(model)
        model.hf_quantizer = quantizer
    return model, packed


def _upcast_trainable(model) -> None:
    """accelerate's fsdp2_prepare_model under mixed precision: trainable parameters in fp32 (full fine-tuning)."""
    import torch

    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)


def _fsdp_kwargs(spec: RankSpec, mesh: Mesh) -> tuple[dict, object]:
    """fully_shard's arguments as worker/loading/sharded.py's _fsdp_kwargs makes them, on a CPU device mesh over the
    fake group; and the ParallelismConfig that holds the mesh (its cp dimension is the ring's)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    from fsdp_tune.worker.loading import sharded as sharded_load
    from fsdp_tune.worker.training.config import parallelism_config

    args = types.SimpleNamespace(parallelism_config=parallelism_config(mesh))
    kwargs = sharded_load._fsdp_kwargs(spec, args)
    if isinstance(kwargs["offload_policy"], CPUOffloadPolicy):  # host shards (unpinned here: no accelerator)
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    return kwargs, args.parallelism_config


def _trainer_checkpointing(model, spec: RankSpec) -> None:
    """The Trainer's activation checkpointing (transformers 5: `activation_checkpointing`), as Trainer.__init__
    enables it on the model it was given."""
    kwargs = dict(spec.trainer_args.activation_checkpointing_kwargs or {})
    every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=kwargs or None, every_n_layers=every, offload=offload
    )


def uniform_layers(built: Built) -> bool:
    """Every decoder layer holds as many parameters (a model with dense and MoE layers, or a first few dense ones,
    does not: its depths cannot be extrapolated in a straight line)."""
    layers = [m for m in built.model.modules() if isinstance(m, built.layer_classes)]
    return len({sum(p.numel() for p in layer.parameters()) for layer in layers}) <= 1


def materialize(built: Built) -> None:
    """Inside the trace's FakeTensorMode: every parameter and buffer a FakeTensor on `cpu` (FSDP2 re-reads its
    shards at lazy init), and each 4-bit module's quant state of the shapes bitsandbytes makes for the whole weight
    (it is the module's, replicated on every rank; collected in built.quant_tensors for the tracker)."""
    built.model.to_empty(device="cpu")
    for module in built.model.modules():
        info = built.packed.get(id(module))
        if info is not None:
            module.quant_state = _fake_quant_state(info, built.dtype)
            built.quant_tensors += _state_tensors(module.quant_state)


def _fake_quant_state(info, dtype: str):
    """bitsandbytes.functional.quantize_4bit's QuantState, by shape: fp32 absmax per block, or (nested) 8-bit absmax
    with an fp32 offset and a second-level state (fp32 absmax per 256 blocks, its 256-entry code)."""
    import torch
    from bitsandbytes.functional import QuantState

    blocks = -(-info.shape[0] * info.shape[1] // info.blocksize)
    common = dict(shape=torch.Size(info.shape), dtype=getattr(torch, dtype), blocksize=info.blocksize)
    code = torch.empty(16, dtype=torch.float32)
    if not info.nested:
        return QuantState(
            absmax=torch.empty(blocks, dtype=torch.float32), code=code, quant_type=info.quant_type, **common
        )
    state2 = QuantState(
        absmax=torch.empty(-(-blocks // 256), dtype=torch.float32),
        code=torch.empty(256, dtype=torch.float32),
        blocksize=256,
        dtype=torch.float32,
    )
    absmax = torch.empty(blocks, dtype=torch.uint8)
    offset = torch.empty((), dtype=torch.float32)
    return QuantState(absmax=absmax, code=code, offset=offset, state2=state2, quant_type=info.quant_type, **common)


def _state_tensors(state) -> list:
    tensors = [state.absmax, state.code, getattr(state, "offset", None)]
    if getattr(state, "state2", None) is not None:
        tensors += [state.state2.absmax, state.state2.code]
    return [t for t in tensors if t is not None]
