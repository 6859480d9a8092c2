"""LoRA / DoRA adapter settings."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rules.registry import error, finding, rule, warning


@rule("FT060", "lora", "LoRA rank, alpha and dropout ranges")
def ranges(cfg: RunConfig) -> Iterator[Finding]:
    lo = cfg.lora
    if lo.lora_r <= 0:
        yield error(cfg, "FT060", "lora.lora_r", f"lora_r must be a positive integer, got {lo.lora_r}", "--lora_r 8")
    if lo.lora_alpha <= 0:
        yield error(
            cfg,
            "FT060",
            "lora.lora_alpha",
            f"lora_alpha must be positive, got {lo.lora_alpha}",
            f"--lora_alpha {2 * max(lo.lora_r, 1)}",
        )
    if not 0 <= lo.lora_dropout < 1:
        yield error(
            cfg,
            "FT060",
            "lora.lora_dropout",
            f"lora_dropout must be in [0, 1), got {lo.lora_dropout}",
            "--lora_dropout 0.1",
        )
    if not lo.lora_target_modules:
        yield error(
            cfg, "FT060", "lora.lora_target_modules", "no LoRA target modules given", "--lora_target_modules all-linear"
        )


@rule("FT061", "lora", "adapter options without LoRA")
def needs_lora(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.lora.use_peft_lora:
        return
    if cfg.lora.use_dora:
        yield error(
            cfg,
            "FT061",
            "lora.use_dora",
            "DoRA is a LoRA variant: --use_dora needs --use_peft_lora True",
            "add --use_peft_lora True",
        )
    for name in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"):
        if cfg.is_set(f"lora.{name}"):
            yield warning(
                cfg,
                "FT061",
                f"lora.{name}",
                "ignored: LoRA is off, so this run fine-tunes every weight",
                "add --use_peft_lora True",
            )
            break


@rule("FT062", "lora", "unsupported adapter back-ends")
def unsupported(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.model.use_unsloth:
        yield error(
            cfg,
            "FT062",
            "model.use_unsloth",
            "Unsloth does not support distributed (FSDP) training",
            "drop --use_unsloth",
        )
    if cfg.lora.use_loftq:
        yield error(
            cfg, "FT062", "lora.use_loftq", "LoftQ initialisation is not supported by fsdp-tune", "drop --use_loftq"
        )


@rule("FT063", "lora", "DoRA under FSDP is slower")
def dora_speed(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.lora.use_dora and cfg.lora.use_peft_lora and not cfg.quantization.use_8bit_quantization:
        yield finding(
            cfg,
            "FT063",
            Severity.NOTE,
            "lora.use_dora",
            "DoRA works under FSDP but trains slower than LoRA (its magnitude vector needs the full weight)",
        )
