"""bitsandbytes QLoRA under FSDP: storage dtypes, 8-bit, optimizers, DoRA."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import FLOATS, compute_precision, quant_storage
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning

# bitsandbytes optimizers whose state FSDP cannot checkpoint (PEFT caveat 4; axolotl, oumi).
PAGED_OPTIMIZERS = ("paged_adamw_8bit", "paged_adamw_32bit", "paged_adamw", "paged_lion_8bit", "paged_lion_32bit")
BNB_8BIT_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit", "lion_8bit", "rmsprop_bnb_8bit", "ademamix_8bit")


@rule("FT050", "quant", "4-bit and 8-bit quantization together")
def both_bits(cfg: RunConfig) -> Iterator[Finding]:
    q = cfg.quantization
    if q.use_4bit_quantization and q.use_8bit_quantization:
        yield error(
            cfg,
            "FT050",
            "quantization.use_8bit_quantization",
            "4-bit and 8-bit quantization are both on",
            "keep --use_4bit_quantization True (QLoRA) and drop --use_8bit_quantization",
        )


@rule("FT051", "quant", "8-bit (LLM.int8) quantization cannot be sharded by FSDP")
def eight_bit_fsdp(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.quantization.use_8bit_quantization:
        yield error(
            cfg,
            "FT051",
            "quantization.use_8bit_quantization",
            '8-bit weights are int8 tensors, which FSDP cannot shard ("Must flatten tensors with uniform dtype")',
            "use --use_4bit_quantization True --bnb_4bit_quant_storage_dtype bfloat16",
        )


@rule("FT052", "quant", "FSDP needs a floating-point quant storage dtype")
def storage_floating(cfg: RunConfig) -> Iterator[Finding]:
    q = cfg.quantization
    if q.use_4bit_quantization and q.bnb_4bit_quant_storage_dtype not in (None, *FLOATS):
        yield error(
            cfg,
            "FT052",
            "quantization.bnb_4bit_quant_storage_dtype",
            f"{q.bnb_4bit_quant_storage_dtype}: FSDP can only shard floating-point storage",
            "--bnb_4bit_quant_storage_dtype bfloat16 (and load the model in bfloat16)",
        )


@rule("FT053", "quant", "quant storage must match the mixed precision and the model dtype")
def storage_matches(cfg: RunConfig) -> Iterator[Finding]:
    q = cfg.quantization
    if not q.use_4bit_quantization or q.bnb_4bit_quant_storage_dtype not in (None, *FLOATS):
        return
    storage = quant_storage(cfg)
    if compute_precision(cfg) == "fp16" and storage != "float32" and cfg.fsdp.version == 1:
        # FSDP2 all-gathers the packed weights in their storage dtype (decide/rank.py fsdp2_qlora_policy), so
        # any float storage works there; FSDP1 flattens each unit into one dtype, the run's
        yield error(
            cfg,
            "FT053",
            "quantization.bnb_4bit_quant_storage_dtype",
            f"FSDP1 with fp16 mixed precision and {storage} storage: FSDP1 would cast the packed 4-bit weights, "
            "and bf16 storage silently computes in bf16 under an fp16 scaler",
            "--bnb_4bit_quant_storage_dtype float32 with fp16, or FSDP2 (fsdp-tune convert --fsdp2)",
        )
    if cfg.model.dtype not in (None, "auto") and cfg.model.dtype != storage:
        yield error(
            cfg,
            "FT053",
            "model.dtype",
            f"the model loads in {cfg.model.dtype} but 4-bit values are stored in {storage}: FSDP needs one "
            "dtype per unit",
            f"--dtype {storage}",
        )
    if q.use_4bit_quantization and q.bnb_4bit_compute_dtype == "float16" and compute_precision(cfg) == "bf16":
        yield warning(
            cfg,
            "FT053",
            "quantization.bnb_4bit_compute_dtype",
            "4-bit matmuls compute in float16 while the run trains in bf16",
            "--bnb_4bit_compute_dtype bfloat16",
        )


@rule("FT054", "quant", "paged / 8-bit bitsandbytes optimizers with FSDP + QLoRA checkpoints")
def paged_optimizer(cfg: RunConfig) -> Iterator[Finding]:
    optim = str(cfg.training.get("optim") or "")
    saves = cfg.training.get("save_strategy") not in ("no", None)
    if not (cfg.quantization.use_4bit_quantization and saves):
        return
    if optim in PAGED_OPTIMIZERS:
        yield error(
            cfg,
            "FT054",
            "training.optim",
            f"{optim} with FSDP + QLoRA fails when a checkpoint is saved (PEFT's FSDP guide, caveat 4)",
            "--optim adamw_torch (or --save_strategy no)",
        )
    elif optim in BNB_8BIT_OPTIMIZERS:
        yield warning(
            cfg,
            "FT054",
            "training.optim",
            f"{optim}'s state is known to break FSDP checkpoint save/resume",
            "--optim adamw_torch, or adamw_torch_8bit on FSDP2",
        )


@rule("FT055", "quant", "DoRA with 8-bit quantization")
def dora_8bit(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.lora.use_dora and cfg.quantization.use_8bit_quantization:
        yield error(
            cfg,
            "FT055",
            "lora.use_dora",
            "DoRA does not work with 8-bit weights (Int8Params cannot be deep-copied)",
            "use 4-bit (QDoRA) or drop --use_dora",
        )


@rule("FT056", "quant", "quantization settings that have no effect")
def idle_quant_settings(cfg: RunConfig) -> Iterator[Finding]:
    q = cfg.quantization
    if q.use_4bit_quantization:
        return
    for name in ("use_nested_quant", "bnb_4bit_quant_type", "bnb_4bit_compute_dtype", "bnb_4bit_quant_storage_dtype"):
        path = f"quantization.{name}"
        if cfg.is_set(path) and getattr(q, name) not in (False, None):
            yield warning(
                cfg,
                "FT056",
                path,
                "ignored: 4-bit quantization is off",
                "add --use_4bit_quantization True, or remove it",
            )


@rule("FT057", "quant", "a quantized model needs an adapter to train")
def quant_needs_adapter(cfg: RunConfig) -> Iterator[Finding]:
    q = cfg.quantization
    if (q.use_4bit_quantization or q.use_8bit_quantization) and not cfg.lora.use_peft_lora:
        path = "quantization.use_4bit_quantization" if q.use_4bit_quantization else "quantization.use_8bit_quantization"
        yield error(
            cfg,
            "FT057",
            path,
            "quantized weights cannot be trained directly: QLoRA needs LoRA adapters",
            "add --use_peft_lora True",
        )
