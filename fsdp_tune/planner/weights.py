"""What the weights take: the frozen base as FSDP holds it, 4-bit packing and its constants, LoRA's size.

Pure arithmetic from the typed config and the model's shape (no torch)."""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import model_dtype, quant_storage
from fsdp_tune.planner import host
from fsdp_tune.planner.adapters import counted_by_peft, peft_trainable
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import Stack
from fsdp_tune.planner.terms import Adapters

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
FOUR_BIT_BYTES = 0.5  # packed NF4/FP4 values, whatever the storage dtype (bf16 storage packs 4 per element)
QUANT_CONST_BYTES = 4 / 64  # fp32 absmax per block of 64
NESTED_CONST_BYTES = 1 / 64 + 4 / (64 * 256)  # 8-bit absmax + fp32 per 256 blocks


def adapters_of(cfg: RunConfig) -> Adapters:
    lo = cfg.lora
    if not lo.use_peft_lora:
        return Adapters(full=True)
    return Adapters(frozenset(lo.lora_target_modules), lo.lora_r, lo.lora_dropout, lo.use_dora)


def lora_params(cfg: RunConfig, shape: ModelShape) -> int:
    """LoRA (and DoRA) values: per nn.Linear of a layer; PEFT's own count where targets reach parameters (MoE
    experts and routers, planner/adapters.py)."""
    if not cfg.lora.use_peft_lora:
        return 0
    if counted_by_peft(cfg, shape):
        return peft_trainable(cfg, shape)
    ad = adapters_of(cfg)
    per_layer = 0
    for lin in shape.layer_linears:
        if ad.trains(lin.name.split(".")[-1]):
            per_layer += ad.r * (lin.in_features + lin.out_features) + (lin.out_features if ad.dora else 0)
    return per_layer * shape.n_layers


def base_bytes(cfg: RunConfig, shape: ModelShape, st: Stack | None = None) -> tuple[float, float]:
    """(all base weights as FSDP holds them, one decoder layer of them): what FSDP shards and offloads."""
    if cfg.quantization.use_4bit_quantization:
        storage = DTYPE_BYTES[quant_storage(cfg)]
        layer_linear = sum(lin.in_features * lin.out_features for lin in shape.layer_linears)
        layer = layer_linear * FOUR_BIT_BYTES + (shape.layer_params - layer_linear) * storage
        rest = shape.total_params - shape.n_layers * shape.layer_params
        return layer * shape.n_layers + rest * storage, layer
    dtype = (st and st.base_dtype_bytes) or DTYPE_BYTES[model_dtype(cfg)]
    return shape.total_params * dtype, shape.layer_params * dtype


def quant_constant_bytes(cfg: RunConfig, shape: ModelShape, st: Stack | None = None, world: int = 1) -> float:
    """The 4-bit weights' quantization state (absmax, and its second level with nested quantization).
    bitsandbytes keeps it on each Linear4bit module (`module.quant_state`), not as a parameter, so FSDP
    (1 and 2) neither shards nor offloads it: every rank holds all of it on its device."""
    if not cfg.quantization.use_4bit_quantization:
        return 0.0
    const = NESTED_CONST_BYTES if cfg.quantization.use_nested_quant else QUANT_CONST_BYTES
    return shape.linear_params * const / (world if st and st.quant_consts_sharded else 1)


def pinned_per_param(cfg: RunConfig, shape: ModelShape, world: int) -> float:
    """FSDP2: one pinned block per parameter shard."""
    storage = DTYPE_BYTES[quant_storage(cfg)] if cfg.quantization.use_4bit_quantization else None
    per_elem = FOUR_BIT_BYTES if storage else DTYPE_BYTES[model_dtype(cfg)]
    dtype = storage or DTYPE_BYTES[model_dtype(cfg)]
    layer = sum(host.pow2(lin.in_features * lin.out_features * per_elem / world) for lin in shape.layer_linears)
    layer_other = shape.layer_params - sum(lin.in_features * lin.out_features for lin in shape.layer_linears)
    rest = shape.total_params - shape.n_layers * shape.layer_params
    # the non-Linear parameters (norms, embeddings, head) are few blocks; rounding them is noise
    return shape.n_layers * layer + (shape.n_layers * layer_other + rest) * dtype / world


def lora_tensors(cfg: RunConfig, shape: ModelShape) -> list[tuple[int, int]]:
    """(rows, values per row) of each trainable LoRA tensor of one decoder layer: lora_A [r, in], lora_B [out, r],
    DoRA's magnitude [out]."""
    ad = adapters_of(cfg)
    out: list[tuple[int, int]] = []
    for lin in shape.layer_linears:
        if ad.trains(lin.name.split(".")[-1]):
            out += [(ad.r, lin.in_features), (lin.out_features, ad.r)] + ([(lin.out_features, 1)] if ad.dora else [])
    return out


def lora_on_rank(cfg: RunConfig, shape: ModelShape, world: int, fsdp_version: int = 2) -> tuple[float, float]:
    """(LoRA values one rank holds sharded, LoRA values of one all-gathered layer) under FSDP2, which shards every
    tensor on dim 0 in chunks of ceil(rows / world) rows, padded (fully_shard's FSDPParam: _init_sharded_param pads
    the local shard, the all-gather output is world padded shards): lora_A has r rows, so once the ranks outnumber
    r every rank holds a whole row of it and the gathered layer world rows. FSDP1 (one padded flat parameter per
    unit) and PEFT-counted targets (MoE experts): the plain share."""
    n = lora_params(cfg, shape)
    if fsdp_version != 2 or counted_by_peft(cfg, shape) or not cfg.lora.use_peft_lora:
        return n / world, n / shape.n_layers
    per_layer = [(-(-rows // world), cols) for rows, cols in lora_tensors(cfg, shape)]
    shard = shape.n_layers * sum(rows * cols for rows, cols in per_layer)
    return float(shard), float(world * sum(rows * cols for rows, cols in per_layer))
