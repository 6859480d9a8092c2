"""A generating method's settings (the row's `generates`: --method grpo, rloo): its rewards, the generation batch,
completion lengths, beta, its loss types and their parameters, its generation backends, and what it takes but
does not use. TRL checks some of these only when GRPOConfig or the trainer is built on every rank (a batch that
does not hold whole groups, reward weights of another length, some loss settings), warns in the rank's log for
others (a loss type with the other importance-sampling level), and says nothing about the rest (a negative beta,
a sapo temperature under another loss type, an entropy bound without the adaptive entropy)."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived
from fsdp_tune.decide.method import generation_batch
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning

KEY = "run.reward_funcs"


def generates(cfg: RunConfig) -> bool:
    """The method generates its completions and scores them with rewards (its row's trait). The rules here are
    every generating method's (the family keeps GRPO's name, as their ids do); a setting one method's config lacks
    is refused before them (FT110), so they read what that config holds."""
    return row_of(cfg.run.method).generates


def _says(cfg: RunConfig) -> str:
    return row_of(cfg.run.method).says


@rule("FT130", "generating", "a generating method (GRPO, RLOO) needs its rewards; rewards need one")
def rewards_given(cfg: RunConfig) -> Iterator[Finding]:
    if generates(cfg) and not cfg.run.reward_funcs:
        message = f"--method {cfg.run.method} scores each completion with reward functions, and none is given"
        hint = "--reward_funcs my_rewards.py:my_function (or a built-in: length_reward, think_format_reward, ...)"
        yield error(cfg, "FT130", KEY, message, hint)
    elif cfg.run.reward_funcs and not generates(cfg):
        yield warning(cfg, "FT130", KEY, f"has no effect under --method {cfg.run.method}", "drop it, or --method grpo")


@rule("FT131", "generating", "each reward names a built-in, a function (file.py:fn, pkg.mod.fn) or a reward model")
def rewards_resolve(cfg: RunConfig) -> Iterator[Finding]:
    """Found without running anything (rewards/resolve.py); the pre-flight imports and calls them (PF088)."""
    if not generates(cfg):
        return
    from fsdp_tune.rewards.resolve import Unresolved, resolve

    names = []
    for entry in cfg.run.reward_funcs:
        try:
            names.append(resolve(entry).name)
        except Unresolved as e:
            yield error(cfg, "FT131", KEY, f"{entry}: {e}", e.hint)
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        message = f"two rewards are named {', '.join(twice)}: TRL logs each under its name, so one hides the other"
        yield warning(cfg, "FT131", KEY, message, "rename one of the functions")


@rule("FT132", "generating", "reward_weights: one weight per reward")
def reward_weights(cfg: RunConfig) -> Iterator[Finding]:
    weights = cfg.training.get("reward_weights") if generates(cfg) else None
    n = len(cfg.run.reward_funcs)
    if weights is not None and n and len(weights) != n:
        message = f"{len(weights)} reward_weights for {n} rewards ({', '.join(cfg.run.reward_funcs)}): TRL refuses it"
        yield error(cfg, "FT132", "training.reward_weights", message, "--reward_weights " + " ".join(["1.0"] * n))


@rule("FT133", "generating", "the generation batch holds whole groups of num_generations completions")
def generation_groups(cfg: RunConfig) -> Iterator[Finding]:
    """GRPO normalizes each reward within the group of completions of one prompt, so every batch it generates holds
    whole groups (GRPOConfig raises otherwise, on every rank)."""
    if not generates(cfg):
        return
    t = cfg.training
    n = int(t.get("num_generations"))
    if n < 2:
        message = f"num_generations {n}: {_says(cfg)} compares at least 2 completions of each prompt"
        yield error(cfg, "FT133", "training.num_generations", message, "--num_generations 4")
        return
    if t.get("generation_batch_size") is not None and t.get("steps_per_generation") is not None:
        message = "generation_batch_size and steps_per_generation both set: each decides the other"
        yield error(cfg, "FT133", "training.generation_batch_size", message, "drop one of them")
        return
    batch, per_step, words = generation_batch(cfg)
    if min(batch, per_step) < 1:
        return  # FT072 refuses the count that makes it
    if t.get("generation_batch_size") is not None and batch % per_step:
        message = f"generation_batch_size {batch} is not a multiple of the global batch {per_step}"
        hint = f"--generation_batch_size {per_step * max(batch // per_step, 1)}"
        yield error(cfg, "FT133", "training.generation_batch_size", message, hint)
    elif batch % n:
        fits = [g for g in range(min(n, batch), 1, -1) if batch % g == 0]
        message = f"each generation makes {batch} completions ({words}): not whole groups of num_generations {n}"
        hint = f"--num_generations {fits[0]}" if fits else f"--per_device_train_batch_size {n}"
        yield error(cfg, "FT133", "training.num_generations", message, hint)
    if t.get("eval_strategy") not in (None, "no"):
        g = int(t.get("num_generations_eval") or n)  # as GRPOTrainer reads it: unset or 0 is num_generations
        held = int(t.get("per_device_eval_batch_size")) * max(cfg.launch.num_processes, 1)
        if held % g:
            message = f"the global eval batch {held} is not a whole number of groups of {g} completions"
            hint = f"--num_generations_eval {_divisor(held, g)}"
            yield error(cfg, "FT133", "training.per_device_eval_batch_size", message, hint)
    if t.get("auto_find_batch_size"):
        message = (
            f"auto_find_batch_size halves the batch on out-of-memory, breaking the groups {_says(cfg)} compares over"
        )
        hint = "drop it; lower --per_device_train_batch_size"
        yield error(cfg, "FT133", "training.auto_find_batch_size", message, hint)


def _divisor(total: int, start: int) -> int:
    return next((g for g in range(min(start, total), 1, -1) if total % g == 0), 2)


@rule("FT134", "generating", "prompt and completion fit max_seq_len")
def completion_length(cfg: RunConfig) -> Iterator[Finding]:
    if not generates(cfg):
        return
    completion = int(cfg.training.get("max_completion_length") or 0)
    if completion >= cfg.data.max_seq_len:
        message = (
            f"max_completion_length {completion} leaves no room for the prompt within max_seq_len "
            f"{cfg.data.max_seq_len} (prompts longer than max_seq_len - max_completion_length are left out)"
        )
        hint = f"--max_seq_len {completion * 2}, or --max_completion_length {cfg.data.max_seq_len // 2}"
        yield error(cfg, "FT134", "training.max_completion_length", message, hint)


@rule("FT135", "generating", "beta: the KL term's weight, 0 or more")
def beta_range(cfg: RunConfig) -> Iterator[Finding]:
    if not generates(cfg):
        return
    beta = float(cfg.training.get("beta") or 0)
    if beta < 0:
        message = f"beta {beta}: a negative KL weight rewards drifting away from the reference"
        yield error(cfg, "FT135", "training.beta", message, "--beta 0.04 (or 0: no KL term)")
    if beta == 0 and cfg.training.is_set("use_bias_correction_kl"):
        yield warning(
            cfg, "FT135", "training.use_bias_correction_kl", "has no effect with beta 0 (no KL term)", "drop it"
        )


# the loss types each of these parameters is read by (grpo_trainer.py _compute_loss)
LOSS_PARAMETERS = {
    "sapo": ("sapo_temperature_neg", "sapo_temperature_pos"),
    "vespo": ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"),
}
ADAPTIVE_ENTROPY = ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")
SEQUENCE_SUMS = ("bnpo", "dr_grpo", "dapo", "cispo")  # sum token terms: sequence-level weights then scale by length
VLLM_ONLY = ("vllm_importance_sampling_mode", "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max")


@rule("FT136", "generating", "a generating method's loss types and the parameters each reads")
def loss_parameters(cfg: RunConfig) -> Iterator[Finding]:
    if not generates(cfg):
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


@rule("FT137", "generating", "how completions are generated: transformers on the ranks, or vLLM (GPUs)", decided=True)
def generation_backend(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    """vLLM is decided as data in the rank spec (GenerationSpec.generation, weight_sync "adapter") and was never run
    here: by reading. TRL's own sync merges the adapter into the sharded base (model.merge_adapter() on every rank,
    vllm_generation.py), which a 4-bit base cannot take (trl#5975, peft#2501); fsdp-tune syncs the adapter alone
    (worker/training/vllm_sync.py), which TRL's vLLM server does not take, so server mode is refused."""
    if not generates(cfg):
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


@rule("FT138", "generating", "generating settings that refuse each other, or that have no effect here")
def grpo_leftovers(cfg: RunConfig) -> Iterator[Finding]:
    yield from _generation_weights(cfg)
    if not generates(cfg):
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
        hint = f"drop it ({_says(cfg)}'s default is false)"
        yield warning(cfg, "FT138", "training.remove_unused_columns", message, hint)
    if cfg.parallelism.enabled and (cfg.parallelism.cp_size > 1 or cfg.parallelism.sp_size > 1):
        message = (
            f"{_says(cfg)} builds its inputs after generating, which context/sequence parallelism cannot shard "
            "(TRL refuses)"
        )
        yield error(cfg, "FT138", "parallelism.cp_size", message, "--parallelism_config_cp_size 1")


def _generation_weights(cfg: RunConfig) -> Iterator[Finding]:
    """--grpo_generation is how transformers' generate() meets FSDP2's shards (planner/generating.py): nothing to choose
    for another method, under vLLM, or under FSDP1 (its units have no unshard(): always sharded)."""
    if not cfg.is_set("run.grpo_generation") or cfg.run.grpo_generation == "auto":
        return
    key, asked = "run.grpo_generation", cfg.run.grpo_generation
    if not generates(cfg):
        yield warning(cfg, "FT138", key, f"has no effect under --method {cfg.run.method}", "drop it")
    elif cfg.training.get("use_vllm"):
        yield warning(cfg, "FT138", key, "has no effect with --use_vllm: vLLM generates", "drop it")
    elif asked == "gathered" and cfg.fsdp.version == 1:
        message = "FSDP1's units have no unshard(): generation stays sharded (every unit gathered per token)"
        yield warning(cfg, "FT138", key, message, "--fsdp_version 2, or drop it")
