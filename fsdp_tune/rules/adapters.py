"""PEFT's LoraConfig fields under FSDP2: which cannot work (refused), which change nothing (dropped), and the
combinations PEFT or FSDP2 would only refuse after the model is loaded on every rank. config/lora_fields.py
holds the verdicts as data; sources/moe.py says what the targets reach on an MoE model."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.lora_fields import INIT_VALUES, VERDICTS
from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rules.registry import error, finding, rule, warning
from fsdp_tune.sources.classes import tied_embeddings
from fsdp_tune.sources.moe import param_targets

EMBEDDINGS = ("embed_tokens", "lm_head")  # PEFT's EMBEDDING_LAYER_NAMES


@rule("FT064", "lora", "LoraConfig fields fsdp-tune cannot honour (refused) or that change nothing (dropped)")
def peft_fields(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.peft.args and not cfg.lora.use_peft_lora:
        name = next(iter(cfg.peft.args))
        yield warning(cfg, "FT064", f"peft.{name}", "ignored: LoRA is off", "add --use_peft_lora True")
        return
    for name in cfg.peft.args:
        verdict = VERDICTS.get(name)
        path = f"peft.{name}"
        if verdict is None:
            yield error(cfg, "FT064", path, f"a LoraConfig field fsdp-tune has not been taught ({name})", "remove it")
        elif verdict.action == "refuse":
            yield error(cfg, "FT064", path, f"cannot work under fsdp-tune: {verdict.why}", verdict.hint)
        elif verdict.action == "drop":
            yield warning(cfg, "FT064", path, f"ignored: {verdict.why}", verdict.hint)
    yield from _values(cfg)


def _values(cfg: RunConfig) -> Iterator[Finding]:
    """Values PEFT would refuse in get_peft_model, on every rank, after loading the model."""
    p = cfg.peft
    task = p.args.get("task_type")
    if (
        task is not None and str(task).upper() != "CAUSAL_LM" and row_of(cfg.run.method).head != "score"
    ):  # reward: FT119
        yield error(
            cfg,
            "FT064",
            "peft.task_type",
            f"task_type {task}: fsdp-tune trains causal language models with TRL's SFTTrainer (CAUSAL_LM)",
            "remove it",
        )
    if p.args.get("inference_mode"):
        yield error(cfg, "FT064", "peft.inference_mode", "inference_mode true freezes the adapter: nothing would train")
    if p.args.get("bias") not in (None, "none", "all", "lora_only"):
        yield error(cfg, "FT064", "peft.bias", f"bias {p.args['bias']}: PEFT takes none, all or lora_only")
    if "layers_pattern" in p.args and "layers_to_transform" not in p.args:
        yield error(cfg, "FT064", "peft.layers_pattern", "PEFT needs layers_to_transform with layers_pattern")
    init = p.args.get("init_lora_weights", True)
    if p.args.get("lora_bias") and (cfg.lora.use_dora or init not in (True, False)):
        why = "DoRA" if cfg.lora.use_dora else f"init_lora_weights {init}"
        yield error(cfg, "FT064", "peft.lora_bias", f"PEFT refuses lora_bias with {why}", "remove one of them")
    elif p.args.get("lora_bias"):
        yield warning(
            cfg,
            "FT064",
            "peft.lora_bias",
            "a LoRA bias cannot be merged into a layer without a bias of its own (most of them: every Llama-family "
            "projection): `fsdp-tune merge` will refuse the adapter; PeftModel.from_pretrained loads it",
            "drop --lora_bias to keep the adapter mergeable",
        )
    for name in ("layers_to_transform", "layers_pattern"):
        if name in p.args and cfg.lora.lora_target_modules == ("all-linear",):
            yield error(
                cfg,
                "FT064",
                f"peft.{name}",
                f"PEFT refuses {name} with target_modules all-linear ('cannot be used when target_modules is a str')",
                "name the modules: --lora_target_modules q_proj k_proj v_proj o_proj gate_proj up_proj down_proj",
            )


@rule("FT065", "lora", "LoRA initialisations that need whole weights, data, or change the base model")
def initialisation(cfg: RunConfig) -> Iterator[Finding]:
    value = cfg.peft.args.get("init_lora_weights")
    if value is None or not cfg.lora.use_peft_lora:
        return
    name = str(value).lower()
    key = "pissa" if name.startswith("pissa") else name
    good = "--init_lora_weights true (PEFT's default), false, gaussian or orthogonal"
    if key not in INIT_VALUES:
        yield error(cfg, "FT065", "peft.init_lora_weights", f"{value}: not an initialisation PEFT knows", good)
    elif INIT_VALUES[key]:
        yield error(cfg, "FT065", "peft.init_lora_weights", f"{value}: {INIT_VALUES[key]}", good)
    elif key == "orthogonal" and cfg.lora.lora_r % 2:
        yield error(
            cfg,
            "FT065",
            "peft.init_lora_weights",
            f"orthogonal initialisation needs an even rank; lora_r is {cfg.lora.lora_r}",
            f"--lora_r {cfg.lora.lora_r + 1}",
        )


@rule(
    "FT066",
    "lora",
    "LoRA on parameters (MoE experts, routers, target_parameters): PEFT's ParamWrapper limits",
    decided=True,
)
def parameter_targets(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    reach = param_targets(cfg, d.model.config)
    if reach is None:
        return
    lo = cfg.lora
    if reach.half_fused:
        yield error(
            cfg,
            "FT066",
            "lora.lora_target_modules",
            f"{' and '.join(reach.half_fused)} are one fused parameter in transformers 5 ({reach.family} "
            "experts): PEFT adapts both or neither",
            f"target both ({' '.join(reach.half_fused)}) or neither",
        )
    if reach.any:
        what = _reached(reach)
        if lo.lora_dropout and cfg.is_set("lora.lora_dropout"):
            yield error(
                cfg, "FT066", "lora.lora_dropout", f"PEFT's LoRA on {what} takes no dropout", "--lora_dropout 0"
            )
        elif lo.lora_dropout:
            yield warning(
                cfg,
                "FT066",
                "lora.lora_dropout",
                f"the default dropout {lo.lora_dropout} becomes 0: PEFT's LoRA on {what} takes none",
                "--lora_dropout 0 says so",
            )
        for path, name in (("lora.use_dora", "DoRA"), ("peft.lora_bias", "lora_bias"), ("peft.fan_in_fan_out", "")):
            section, field = path.split(".")
            if getattr(lo, field, None) or (section == "peft" and cfg.peft.args.get(field)):
                yield error(cfg, "FT066", path, f"PEFT's LoRA on {what} cannot take {name or field}", "remove it")
    yield from _moe_notes(cfg, reach)


def _reached(reach) -> str:
    parts = [f"the experts ({', '.join(reach.experts)})"] if reach.experts else []
    parts += ["the router (gate.weight)"] if reach.router else []
    parts += [f"target_parameters ({', '.join(reach.explicit)})"] if reach.explicit else []
    return " and ".join(parts)


def _moe_notes(cfg: RunConfig, reach) -> Iterator[Finding]:
    if reach.moe and not reach.experts and not reach.explicit and not cfg.is_set("lora.lora_target_modules"):
        yield warning(
            cfg,
            "FT066",
            "lora.lora_target_modules",
            f"on this {reach.family or 'MoE'} model the default targets adapt attention only: the experts (most of "
            "the weights) are not adapted",
            "--lora_target_modules all-linear (experts and router), or --lora_target_parameters "
            "mlp.experts.gate_up_proj mlp.experts.down_proj",
        )
    if reach.moe and cfg.quantization.use_4bit_quantization:
        yield finding(
            cfg,
            "FT066",
            Severity.NOTE,
            "quantization.use_4bit_quantization",
            "bitsandbytes quantizes nn.Linear layers only: the fused experts (most of an MoE's weights) stay in the "
            "load dtype, so 4-bit saves little on this model",
        )


@rule("FT067", "lora", "training embeddings under FSDP2: modules_to_save and trainable tokens", decided=True)
def embeddings(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if not cfg.lora.use_peft_lora:
        return
    saved = [m for m in cfg.peft.get("modules_to_save") or () if m.split(".")[-1] in EMBEDDINGS]
    tokens = cfg.peft.get("trainable_token_indices")
    tied = tied_embeddings(d.model.config) if saved or tokens is not None else None
    if saved and tied and not cfg.peft.get("ensure_weight_tying"):
        yield error(
            cfg,
            "FT067",
            "peft.modules_to_save",
            f"{', '.join(saved)}: this model ties its input and output embeddings, and a trainable copy of one "
            "breaks the tie; FSDP2 then refuses the shared weight ('is shared with a parameter already managed by "
            "another FSDP group')",
            "--ensure_weight_tying true (one trained matrix for both, as the model has)",
        )
    elif saved:
        yield finding(
            cfg,
            "FT067",
            Severity.NOTE,
            "peft.modules_to_save",
            f"{', '.join(saved)}: the whole vocabulary matrix trains: a copy beside the frozen original, with its "
            "gradients and AdamW state, and the adapter carries it (~0.5B trainable values for 128k x 4096)",
        )
    if tokens is not None and tied:
        yield error(
            cfg,
            "FT067",
            "peft.trainable_token_indices",
            "trainable tokens on tied embeddings: FSDP2 cannot shard the tied wrapper ('Invariant encountered')",
            "modules_to_save embed_tokens with --ensure_weight_tying true",
        )


@rule("FT068", "lora", "QLoRA + DoRA under FSDP2")
def qdora(cfg: RunConfig) -> Iterator[Finding]:
    lo, q = cfg.lora, cfg.quantization
    if lo.use_peft_lora and lo.use_dora and q.use_4bit_quantization and cfg.fsdp.version == 2:
        yield error(
            cfg,
            "FT068",
            "lora.use_dora",
            "TRL casts a 4-bit model's LoRA weights to bf16 but keeps DoRA's magnitude vectors in fp32, and FSDP2 "
            "needs one dtype for a unit's trainable parameters ('FSDP expects uniform original parameter dtype')",
            "drop --use_dora, or train DoRA without 4-bit quantization",
        )
