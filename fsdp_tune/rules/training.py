"""Trainer / SFTConfig settings: precision, ranges, save options."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.redact import is_secret_key, redact_text
from fsdp_tune.rules.registry import error, finding, rule, warning


@rule("FT070", "training", "fp16 and bf16 together")
def both_precisions(cfg: RunConfig) -> Iterator[Finding]:
    t = cfg.training
    if t.get("fp16") and t.get("bf16"):
        yield error(cfg, "FT070", "training.fp16", "--fp16 and --bf16 are both on", "keep one (bf16 on H100/A100)")


@rule("FT071", "training", "flag precision overrides the config's mixed_precision")
def precision_override(cfg: RunConfig) -> Iterator[Finding]:
    t = cfg.training
    mp = cfg.launch.mixed_precision
    for name, mode in (("bf16", "bf16"), ("fp16", "fp16")):
        if t.is_set(name) and t.get(name) and cfg.is_set("launch.mixed_precision") and mp not in (mode, "no"):
            yield warning(
                cfg,
                "FT071",
                f"training.{name}",
                f"overrides {cfg.where('launch.mixed_precision')} = {mp}: the run uses {mode}",
                "make them agree",
            )
    if mp == "fp8":
        yield warning(
            cfg,
            "FT071",
            "launch.mixed_precision",
            "fp8 needs Transformer Engine or MS-AMP on Hopper GPUs",
            "use bf16 unless fp8 kernels are installed",
        )


_POSITIVE_INT = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "generation_batch_size",  # GRPO's; unset (None) for the other methods
    "steps_per_generation",
    "num_iterations",
)
_POSITIVE_HINT = {"generation_batch_size": "drop it: the method generates the batch x ranks x steps_per_generation"}


@rule("FT072", "training", "numeric ranges")
def numeric_ranges(cfg: RunConfig) -> Iterator[Finding]:
    t = cfg.training
    for name in _POSITIVE_INT:
        value = t.get(name)
        if value is not None and value < 1:
            hint = _POSITIVE_HINT.get(name, f"--{name} 1")
            yield error(cfg, "FT072", f"training.{name}", f"{name} must be at least 1, got {value}", hint)
    if cfg.data.max_seq_len < 1:
        yield error(
            cfg,
            "FT072",
            "data.max_seq_len",
            f"max_seq_len must be at least 1, got {cfg.data.max_seq_len}",
            "--max_seq_len 2048",
        )
    lr = t.get("learning_rate")
    if lr is not None and lr <= 0:
        yield error(
            cfg, "FT072", "training.learning_rate", f"learning_rate must be positive, got {lr}", "--learning_rate 1e-4"
        )
    elif lr is not None and lr >= 1:
        yield warning(
            cfg, "FT072", "training.learning_rate", f"learning_rate {lr} is far above LoRA's usual 1e-5..1e-3"
        )
    norm = t.get("max_grad_norm")
    if norm is not None and norm < 0:
        yield error(
            cfg,
            "FT072",
            "training.max_grad_norm",
            f"max_grad_norm must be >= 0 (0 disables clipping), got {norm}",
            "--max_grad_norm 1.0",
        )
    if t.get("max_steps") in (None, -1, 0) and (t.get("num_train_epochs") or 0) <= 0:
        yield error(
            cfg,
            "FT072",
            "training.num_train_epochs",
            "nothing to train: num_train_epochs <= 0 and no max_steps",
            "--num_train_epochs 1 or --max_steps N",
        )
    ratio = t.get("warmup_ratio")
    if ratio is not None and not 0 <= ratio < 1:
        yield error(cfg, "FT072", "training.warmup_ratio", f"warmup_ratio must be in [0, 1), got {ratio}")
    steps = t.get("warmup_steps")
    if isinstance(steps, (int, float)) and steps < 0:
        yield error(cfg, "FT072", "training.warmup_steps", f"warmup_steps must be >= 0, got {steps}")
    yield from _intervals(cfg)
    yield from _timeout(cfg)


# (the `*_steps` field, the strategy that reads it); TrainingArguments checks them only once a rank builds it
_INTERVALS = (("logging_steps", "logging_strategy"), ("save_steps", "save_strategy"), ("eval_steps", "eval_strategy"))


def _intervals(cfg: RunConfig) -> Iterator[Finding]:
    """logging/save/eval steps under the `steps` strategy: above 0 (below 1 is a share of the run's steps), and
    whole above 1, as TrainingArguments requires; a zero or negative interval would fail on every rank."""
    t = cfg.training
    for name, strategy in _INTERVALS:
        value = t.get(name)
        if value is None or t.get(strategy) != "steps":
            continue
        if value <= 0:
            yield error(
                cfg,
                "FT072",
                f"training.{name}",
                f"{name} must be above 0 with {strategy} steps, got {value:g}",
                f"--{name} 10 (every 10 steps; below 1: a share of the run's steps), or --{strategy} no",
            )
        elif value > 1 and value != int(value):
            message = f"{name} above 1 must be whole, got {value:g}"
            yield error(cfg, "FT072", f"training.{name}", message, f"--{name} {int(value)}")


def _timeout(cfg: RunConfig) -> Iterator[Finding]:
    """ddp_timeout bounds every collective: 0 or less would time out the first one (torch has no "never")."""
    timeout = cfg.training.get("ddp_timeout")
    if timeout is not None and timeout <= 0:
        yield error(
            cfg,
            "FT072",
            "training.ddp_timeout",
            f"ddp_timeout must be at least 1 second, got {timeout} (it bounds every collective; torch has no "
            "setting for no timeout)",
            "--ddp_timeout 1800 (the default), or more for slow steps",
        )


@rule("FT073", "training", "save_only_model with FSDP")
def save_only_model(cfg: RunConfig) -> Iterator[Finding]:
    t = cfg.training
    if not t.get("save_only_model"):
        return
    if t.get("load_best_model_at_end"):
        yield error(
            cfg,
            "FT073",
            "training.save_only_model",
            "FSDP can't use save_only_model together with load_best_model_at_end",
            "drop one of them",
        )
    if cfg.fsdp.state_dict_type == "SHARDED_STATE_DICT":
        yield error(
            cfg,
            "FT073",
            "training.save_only_model",
            "save_only_model is not compatible with SHARDED_STATE_DICT checkpoints",
            "drop --save_only_model, or use FULL_STATE_DICT",
        )


@rule("FT074", "training", "settings fsdp-tune owns")
def owned_settings(cfg: RunConfig) -> Iterator[Finding]:
    t = cfg.training
    for name, why in (
        ("deepspeed", "fsdp-tune launches FSDP, not DeepSpeed"),
        ("parallelism_config", "use --use_parallelism_config and --parallelism_config_* flags"),
    ):
        if t.is_set(name):
            yield error(cfg, "FT074", f"training.{name}", f"--{name} cannot be set here: {why}", f"remove --{name}")


@rule("FT075", "training", "use_reentrant only affects gradient checkpointing")
def reentrant(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.is_set("run.use_reentrant") and cfg.run.use_reentrant and cfg.fsdp.activation_checkpointing:
        yield warning(
            cfg,
            "FT075",
            "run.use_reentrant",
            "FSDP's activation checkpointing is non-reentrant; this setting only affects --gradient_checkpointing",
            "remove it",
        )


@rule("FT076", "training", "PEFT-example packing options that TRL 1.x decides itself")
def packing_token_options(cfg: RunConfig) -> Iterator[Finding]:
    for name, what in (
        ("append_concat_token", "TRL appends the EOS token to every sample (eos_token decides which)"),
        ("add_special_tokens", "TRL tokenizes rendered text without adding BOS a second time"),
    ):
        if cfg.is_set(f"data.{name}"):
            yield finding(
                cfg,
                "FT076",
                Severity.NOTE,
                f"data.{name}",
                f"accepted for PEFT's examples/sft; with TRL 1.x it has no effect: {what}",
            )


@rule("FT077", "training", "a Hub token on the command line is seen by ps and kept in shell history")
def hub_token_in_files(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.training.is_set("hub_token"):
        yield warning(
            cfg,
            "FT077",
            "training.hub_token",
            "fsdp-tune keeps the token out of the run's files and logs (the ranks get it as HF_TOKEN), but a "
            "command line is visible to other users of this machine (ps) and stays in your shell history",
            "export HF_TOKEN instead (or `hf auth login`), and drop --hub_token",
        )


@rule("FT078", "training", "a value that looks like a secret token outside a secret's own setting")
def token_like_values(cfg: RunConfig) -> Iterator[Finding]:
    """A run name, a Hub repo id or a path that looks like a token (hf_..., sk-..., ghp_...: redact.py's pattern,
    the one the run's files are redacted by) would be written in clear into the rank spec (fsdp_tune_resolved.json),
    which the ranks read as it stands, and reach trackers and the Hub: refused, rather than trained under a
    redacted name. A secret's own setting (--hub_token) travels in the ranks' environment and is not this."""
    for section, values in cfg.as_dict().items():
        for name, value in values.items():
            texts = value if isinstance(value, list) else [value]
            if is_secret_key(name) or not any(isinstance(t, str) and redact_text(t) != t for t in texts):
                continue
            yield error(
                cfg,
                "FT078",
                f"{section}.{name}",
                f"the value looks like a secret token ({redact_text(str(value))}); it would be written in clear "
                "into the run's rank spec (fsdp_tune_resolved.json) and reach the trackers",
                f"choose a {name} that is not a token (a token for the Hub goes in HF_TOKEN)",
            )
