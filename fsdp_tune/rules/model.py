"""Settings that name parts of the model: checked against the model's own architecture when its config.json
is on this machine (see model_source: a local folder, a shipped reference config, the Hugging Face cache).
Otherwise these rules say nothing; the worker meets the problem after loading the model."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning
from fsdp_tune.sources import model as model_source

# torch.nn classes a user may list beside the model's own (accelerate matches class names anywhere in the tree)
TORCH_MODULES = frozenset({"Embedding", "Linear", "LayerNorm", "RMSNorm", "ModuleList", "Sequential", "Conv1d"})


@rule("FT085", "model", "builtin:NAME must be a model fsdp-tune builds")
def builtin_model(cfg: RunConfig) -> Iterator[Finding]:
    name = cfg.model.model_name_or_path or ""
    if not name.startswith("builtin:"):
        return
    from fsdp_tune.sources.builtin import PRESETS

    wanted = name.removeprefix("builtin:")
    if wanted in PRESETS:
        return
    closest = difflib.get_close_matches(wanted, list(PRESETS), n=1, cutoff=0.3)
    yield error(
        cfg,
        "FT085",
        "model.model_name_or_path",
        f"{name} is not a model fsdp-tune builds; the builtins are {', '.join('builtin:' + p for p in PRESETS)}",
        f"--model_name_or_path builtin:{closest[0] if closest else 'tiny-llama'}"
        + (" (the closest)" if closest else "")
        + ", a local folder, or a Hub id",
    )


@rule("FT080", "model", "layer classes to wrap must exist in the model", decided=True)
def layer_classes(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    wanted = cfg.fsdp.transformer_layer_cls_to_wrap
    if cfg.fsdp.auto_wrap_policy != "TRANSFORMER_BASED_WRAP":
        return
    src = model_source.for_config(d.model.config)
    if src is None:
        return
    if not wanted:
        if not src.no_split_modules:
            layers = sorted(c for c in src.classes if c.endswith(("DecoderLayer", "Block")))
            yield warning(
                cfg,
                "FT080",
                "fsdp.transformer_layer_cls_to_wrap",
                f"{src.model_type} models declare no _no_split_modules, which TRANSFORMER_BASED_WRAP uses when "
                "no layer class is named: accelerate would find nothing to wrap",
                f"name the layer class: --fsdp_transformer_layer_cls_to_wrap {layers[0] if layers else 'CLASS'}",
            )
        return
    missing = [c for c in wanted if c not in src.classes and c not in TORCH_MODULES]
    if not missing:
        return
    layers = src.no_split_modules or tuple(sorted(c for c in src.classes if c.endswith("DecoderLayer")))
    hint = (
        f"the {src.model_type} decoder layer is {', '.join(layers)}: set fsdp_transformer_layer_cls_to_wrap to it, "
        "or leave it out (the model's own _no_split_modules are used)"
        if layers
        else "leave it out: the model's own _no_split_modules are used"
    )
    yield error(
        cfg,
        "FT080",
        "fsdp.transformer_layer_cls_to_wrap",
        f"{', '.join(missing)}: no such class in {cfg.model.model_name_or_path} ({src.model_type}); accelerate "
        f"would stop with 'Could not find the transformer layer class' after loading the model",
        hint,
    )


@rule("FT081", "model", "LoRA target modules must exist in the model", decided=True)
def lora_targets(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    targets = cfg.lora.lora_target_modules
    if not cfg.lora.use_peft_lora or not targets or targets == ("all-linear",):
        return
    src = model_source.for_config(d.model.config)
    if src is None:
        return
    from fsdp_tune.config.lora_fields import moe_tables

    family = moe_tables()["model_types"].get(src.model_type)  # PEFT maps these names onto fused experts
    known = src.submodules | set(moe_tables()["targets"].get(family, {}))
    missing = [t for t in targets if t.split(".")[-1] not in known]
    if not missing:
        return
    guesses = sorted({g for t in missing for g in difflib.get_close_matches(t.split(".")[-1], src.linears, n=2)})
    if guesses:
        hint = f"did you mean {', '.join(guesses)}? or --lora_target_modules all-linear"
    else:
        linears = sorted(src.linears - {"lm_head"})
        hint = f"{src.model_type} has {', '.join(linears)}; or --lora_target_modules all-linear"
    where = f"in {cfg.model.model_name_or_path} ({src.model_type})"
    if len(missing) == len(targets):
        yield error(
            cfg,
            "FT081",
            "lora.lora_target_modules",
            f"none of {', '.join(targets)} is a module {where}: PEFT would stop with 'Target modules ... not "
            "found in the base model' after loading it",
            hint,
        )
    else:
        yield warning(
            cfg,
            "FT081",
            "lora.lora_target_modules",
            f"{', '.join(missing)}: no such module {where}; PEFT silently adapts only "
            f"{', '.join(t for t in targets if t not in missing)}",
            hint,
        )


@rule("FT082", "model", "flash-attention needs half precision")
def flash_attention_dtype(cfg: RunConfig) -> Iterator[Finding]:
    from fsdp_tune.decide.derived import model_dtype

    if cfg.model.use_flash_attn and model_dtype(cfg) == "float32":
        yield error(
            cfg,
            "FT082",
            "model.use_flash_attn",
            "the model would load in float32 (no bf16/fp16 mixed precision): transformers only warns, and "
            "flash-attention then fails at the first forward ('FlashAttention only support fp16 and bf16')",
            "--bf16 True (or --dtype bfloat16), or drop --use_flash_attn (SDPA is used)",
        )


@rule("FT083", "model", "trust_remote_code runs the model's own Python code on every rank", decided=True)
def remote_code(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if not cfg.model.trust_remote_code:
        return
    name = cfg.model.model_name_or_path or "the model"
    files = model_source.code_files(d.model)
    if files:
        what = f"its code files {', '.join(files)}"
    elif files is None:
        what = "code downloaded from the hub with it at load time (not on this machine to name)"
    else:
        what = "no code file today (transformers knows the model), but any it gains later"
    yield warning(
        cfg,
        "FT083",
        "model.trust_remote_code",
        f"every rank imports and runs Python that comes with {name}, with your permissions: {what}",
        "read that code first, or drop trust_remote_code when transformers supports the model natively",
    )


@rule("FT084", "model", "the attention implementation must be one the model's class supports", decided=True)
def attention_support(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    from fsdp_tune.sources.classes import FLAGS, attention_support

    m = cfg.model
    requested = "flash_attention_2" if m.use_flash_attn else m.attn_implementation
    flag = FLAGS.get(requested or "")
    support = attention_support(d.model.config) if flag else None
    if support is None or support.supports[flag]:
        return
    why = support.why_not.get(flag)
    yield error(
        cfg,
        "FT084",
        "model.use_flash_attn" if m.use_flash_attn else "model.attn_implementation",
        f"{support.model_class} does not support {requested}{f' ({why})' if why else ''}: transformers refuses to "
        "load it so, on every rank",
        f"drop it: fsdp-tune then uses {support.default}, what {support.model_class} supports",
    )


@rule("FT036", "model", "--loading sharded where sharded loading cannot take the run", decided=True)
def sharded_loading(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    from fsdp_tune.decide.loading import why_not_sharded

    if cfg.model.loading != "sharded":
        return
    why = why_not_sharded(cfg, d.model)
    if why:
        yield error(
            cfg,
            "FT036",
            "model.loading",
            f"sharded loading cannot take this run: {why}",
            "--loading auto loads it with from_pretrained on every rank instead",
        )
