"""GRPO's loss types and their parameters, its generation backends, and what it takes but does not use. TRL raises for
some of these in GRPOConfig.__post_init__ or the trainer's constructor, on every rank; warns in the rank's log for
others (a loss type with the other importance-sampling level); says nothing about the rest (a sapo temperature under
another loss type, an entropy bound without the adaptive entropy)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.errors import Finding
from fsdp_tune.rules.grpo import is_grpo
from fsdp_tune.rules.registry import error, rule, warning

# the loss types each of these parameters is read by (grpo_trainer.py _compute_loss)
LOSS_PARAMETERS = {
    "sapo": ("sapo_temperature_neg", "sapo_temperature_pos"),
    "vespo": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
}
ADAPTIVE_ENTROPY = ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")
SEQUENCE_SUMS = ("bnpo", "dr_grpo", "dapo", "cispo")  # sum token terms: sequence-level weights then scale by length
VLLM_ONLY = ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max")


@rule("FT136", "grpo", "GRPO's loss types and the parameters each reads")
def loss_parameters(cfg: RunConfig) -> Iterator[Finding]:
    if not is_grpo(cfg):
        return
    t = cfg.training
    loss, level = t.get("loss_type"), t.get("importance_sampling_level")
    for owner, names in LOSS_PARAMETERS.items():
        for name in names:
            if t.is_set(name) and loss != owner:
                message = f"has no effect: only loss_type {owner} reads it, not {loss}"
                yield warning(cfg, "FT136", f"training.{name}", message, f"drop it, or --loss_type {owner}")
    if loss == "luspo" and level != "sequence":
        message = "luspo is a sequence-level loss (LUSPO scales GSPO's): TRL warns and runs it with token-level ratios"
        yield warning(cfg, "FT136", "training.loss_type", message, "--importance_sampling_level sequence")
    if loss == "vespo" and level == "sequence":
        message = "vespo makes its sequence-level weights itself from token-level ratios"
        yield warning(cfg, "FT136", "training.importance_sampling_level", message, "drop --importance_sampling_level")
    if level == "sequence" and loss in SEQUENCE_SUMS:
        message = f"{loss} sums per-token terms, so sequence-level ratios weigh each sequence by its length"
        hint = "--loss_type grpo (GSPO's setup)"
        yield warning(cfg, "FT136", "training.importance_sampling_level", message, hint)
    quantile = t.get("top_entropy_quantile")
    if quantile is not None and not 0 < float(quantile) <= 1:
        message = f"top_entropy_quantile {quantile}: the share of tokens kept, in (0, 1]"
        yield error(cfg, "FT136", "training.top_entropy_quantile", message, "--top_entropy_quantile 0.2")
    if not t.get("use_adaptive_entropy"):
        for name in (n for n in ADAPTIVE_ENTROPY if t.is_set(n)):
            yield warning(cfg, "FT136", f"training.{name}", "has no effect without --use_adaptive_entropy", "drop it")
    if int(t.get("num_iterations") or 1) < 1:
        yield error(cfg, "FT136", "training.num_iterations", "num_iterations must be 1 or more", "--num_iterations 1")


@rule("FT137", "grpo", "how GRPO generates: transformers on the ranks, or vLLM (GPUs, colocated)", decided=True)
def generation_backend(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    """vLLM is decided as data in the rank spec (GrpoSpec.generation, weight_sync "adapter") and was never run here:
    by reading. TRL's own sync merges the adapter into the sharded base (model.merge_adapter() on every rank,
    vllm_generation.py), which a 4-bit base cannot take (trl#5975, peft#2501); fsdp-tune syncs the adapter alone
    (worker/training/vllm_sync.py), which TRL's vLLM server does not take, so server mode is refused."""
    if not is_grpo(cfg):
        return
    t = cfg.training
    if t.get("use_vllm"):
        yield from _vllm(cfg, d.on_cpu)
    else:
        for name in sorted(n for n in t.args if n.startswith("vllm_")):
            yield warning(cfg, "FT137", f"training.{name}", "has no effect without --use_vllm", "drop it")
    continuous = t.get("use_transformers_continuous_batching") or t.get("use_transformers_paged")
    if continuous and cfg.launch.num_processes > 1:
        message = (
            "transformers' continuous batching (generate_batch) does not step the ranks together: under FSDP a rank "
            "that finishes first leaves the others waiting in an all-gather"
        )
        yield error(cfg, "FT137", "training.use_transformers_continuous_batching", message, "drop it")


def _vllm(cfg: RunConfig, on_cpu: bool) -> Iterator[Finding]:
    t = cfg.training
    if on_cpu:
        message = "vLLM generates on GPUs; this run is on CPU (asked for, or a machine without GPUs)"
        yield error(cfg, "FT137", "training.use_vllm", message, "drop --use_vllm (transformers generates on the ranks)")
    if t.get("vllm_mode") == "server":
        message = (
            "vLLM server mode takes the policy's whole weights from the trainer, which means merging the adapter into "
            "the sharded base on every sync (TRL's way; it fails for a 4-bit base): fsdp-tune syncs the adapter alone, "
            "which only the colocated engine takes"
        )
        yield error(cfg, "FT137", "training.vllm_mode", message, "--vllm_mode colocate, or drop --use_vllm")
    extras = [
        n
        for n, on in (
            ("DoRA", cfg.lora.use_dora),
            ("modules_to_save", bool(cfg.peft.get("modules_to_save"))),
            ("trainable_token_indices", bool(cfg.peft.get("trainable_token_indices"))),
        )
        if on
    ]
    if extras:
        message = f"vLLM takes the adapter as plain LoRA (A and B); {', '.join(extras)} would not reach it"
        yield error(cfg, "FT137", "training.use_vllm", message, "drop --use_vllm, or train plain LoRA")
    if t.get("vllm_enable_sleep_mode"):
        message = (
            "sleep mode discards vLLM's base weights, which fsdp-tune never sends back (it syncs the adapter alone)"
        )
        yield error(cfg, "FT137", "training.vllm_enable_sleep_mode", message, "drop --vllm_enable_sleep_mode")
    low, high = t.get("vllm_importance_sampling_clip_min"), t.get("vllm_importance_sampling_clip_max")
    mode = t.get("vllm_importance_sampling_mode") or ""
    correcting = t.get("vllm_importance_sampling_correction")
    if low is not None and high is not None and low >= high:
        message = f"vllm_importance_sampling_clip_min {low} is not below clip_max {high}"
        yield error(cfg, "FT137", "training.vllm_importance_sampling_clip_min", message, "a bound below clip_max")
    if correcting and mode.endswith("_truncate") and low is None and high is None:
        message = f"{mode} clips the ratios and no bound is set"
        yield error(
            cfg, "FT137", "training.vllm_importance_sampling_mode", message, "--vllm_importance_sampling_clip_max 3"
        )
    if correcting and t.get("loss_type") == "vespo" and mode not in ("token_truncate", "token_mask"):
        message = f"vespo makes its own sequence weights; TRL takes token_truncate or token_mask with it, not {mode}"
        yield error(
            cfg,
            "FT137",
            "training.vllm_importance_sampling_mode",
            message,
            "--vllm_importance_sampling_mode token_mask",
        )


@rule("FT138", "grpo", "GRPO settings that refuse each other, or that have no effect here")
def grpo_leftovers(cfg: RunConfig) -> Iterator[Finding]:
    yield from _generation_weights(cfg)
    if not is_grpo(cfg):
        return
    t = cfg.training
    if t.get("log_completions_hub_repo") and not t.get("log_completions"):
        message = "log_completions_hub_repo uploads the completions log_completions writes, which is off"
        yield error(cfg, "FT138", "training.log_completions_hub_repo", message, "--log_completions true")
    if t.is_set("ds3_gather_for_generation"):
        yield warning(
            cfg, "FT138", "training.ds3_gather_for_generation", "has no effect: it is DeepSpeed ZeRO-3's", "drop it"
        )
    if t.get("remove_unused_columns"):
        message = "keeps only the prompt column: the rewards then receive none of the dataset's other columns"
        yield warning(cfg, "FT138", "training.remove_unused_columns", message, "drop it (GRPO's default is false)")
    if cfg.parallelism.enabled and (cfg.parallelism.cp_size > 1 or cfg.parallelism.sp_size > 1):
        message = (
            "GRPO builds its inputs after generating, which context/sequence parallelism cannot shard (TRL refuses)"
        )
        yield error(cfg, "FT138", "parallelism.cp_size", message, "--parallelism_config_cp_size 1")


def _generation_weights(cfg: RunConfig) -> Iterator[Finding]:
    """--grpo_generation is how transformers' generate() meets FSDP2's shards (planner/grpo.py): nothing to choose
    for another method, under vLLM, or under FSDP1 (its units have no unshard(): always sharded)."""
    if not cfg.is_set("run.grpo_generation") or cfg.run.grpo_generation == "auto":
        return
    key, asked = "run.grpo_generation", cfg.run.grpo_generation
    if not is_grpo(cfg):
        yield warning(cfg, "FT138", key, f"has no effect under --method {cfg.run.method}", "drop it")
    elif cfg.training.get("use_vllm"):
        yield warning(cfg, "FT138", key, "has no effect with --use_vllm: vLLM generates", "drop it")
    elif asked == "gathered" and cfg.fsdp.version == 1:
        message = "FSDP1's units have no unshard(): generation stays sharded (every unit gathered per token)"
        yield warning(cfg, "FT138", key, message, "--fsdp_version 2, or drop it")
