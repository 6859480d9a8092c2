"""GRPO's settings (--method grpo): its rewards, the generation batch, completion lengths and beta. TRL checks some of
these only when GRPOConfig or the trainer is built on every rank (a batch that does not hold whole groups, reward
weights of another length), some not at all (a negative beta). The loss types and vLLM: rules/grpo_loss.py."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.method import generation_batch
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning

KEY = "run.reward_funcs"


def is_grpo(cfg: RunConfig) -> bool:
    """The method generates its completions and scores them with rewards (its row's trait)."""
    return row_of(cfg.run.method).generates


@rule("FT130", "grpo", "GRPO needs its rewards; rewards need GRPO")
def rewards_given(cfg: RunConfig) -> Iterator[Finding]:
    if is_grpo(cfg) and not cfg.run.reward_funcs:
        message = "--method grpo scores each completion with reward functions, and none is given"
        hint = "--reward_funcs my_rewards.py:my_function (or a built-in: length_reward, think_format_reward, ...)"
        yield error(cfg, "FT130", KEY, message, hint)
    elif cfg.run.reward_funcs and not is_grpo(cfg):
        yield warning(cfg, "FT130", KEY, f"has no effect under --method {cfg.run.method}", "drop it, or --method grpo")


@rule("FT131", "grpo", "each reward names a built-in, a function (file.py:fn, pkg.mod.fn) or a reward model")
def rewards_resolve(cfg: RunConfig) -> Iterator[Finding]:
    """Found without running anything (rewards/resolve.py); the pre-flight imports and calls them (PF088)."""
    if not is_grpo(cfg):
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


@rule("FT132", "grpo", "reward_weights: one weight per reward")
def reward_weights(cfg: RunConfig) -> Iterator[Finding]:
    weights = cfg.training.get("reward_weights") if is_grpo(cfg) else None
    n = len(cfg.run.reward_funcs)
    if weights is not None and n and len(weights) != n:
        message = f"{len(weights)} reward_weights for {n} rewards ({', '.join(cfg.run.reward_funcs)}): TRL refuses it"
        yield error(cfg, "FT132", "training.reward_weights", message, "--reward_weights " + " ".join(["1.0"] * n))


@rule("FT133", "grpo", "the generation batch holds whole groups of num_generations completions")
def generation_groups(cfg: RunConfig) -> Iterator[Finding]:
    """GRPO normalizes each reward within the group of completions of one prompt, so every batch it generates holds
    whole groups (GRPOConfig raises otherwise, on every rank)."""
    if not is_grpo(cfg):
        return
    t = cfg.training
    n = int(t.get("num_generations"))
    if n < 2:
        message = f"num_generations {n}: GRPO compares at least 2 completions of each prompt"
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
        message = "auto_find_batch_size halves the batch on out-of-memory, breaking the groups GRPO normalizes over"
        hint = "drop it; lower --per_device_train_batch_size"
        yield error(cfg, "FT133", "training.auto_find_batch_size", message, hint)


def _divisor(total: int, start: int) -> int:
    return next((g for g in range(min(start, total), 1, -1) if total % g == 0), 2)


@rule("FT134", "grpo", "prompt and completion fit max_seq_len")
def completion_length(cfg: RunConfig) -> Iterator[Finding]:
    if not is_grpo(cfg):
        return
    completion = int(cfg.training.get("max_completion_length") or 0)
    if completion >= cfg.data.max_seq_len:
        message = (
            f"max_completion_length {completion} leaves no room for the prompt within max_seq_len "
            f"{cfg.data.max_seq_len} (prompts longer than max_seq_len - max_completion_length are left out)"
        )
        hint = f"--max_seq_len {completion * 2}, or --max_completion_length {cfg.data.max_seq_len // 2}"
        yield error(cfg, "FT134", "training.max_completion_length", message, hint)


@rule("FT135", "grpo", "beta: the KL term's weight, 0 or more")
def beta_range(cfg: RunConfig) -> Iterator[Finding]:
    if not is_grpo(cfg):
        return
    beta = float(cfg.training.get("beta") or 0)
    if beta < 0:
        message = f"beta {beta}: a negative KL weight rewards drifting away from the reference"
        yield error(cfg, "FT135", "training.beta", message, "--beta 0.04 (or 0: no KL term)")
    if beta == 0 and cfg.training.is_set("use_bias_correction_kl"):
        yield warning(
            cfg, "FT135", "training.use_bias_correction_kl", "has no effect with beta 0 (no KL term)", "drop it"
        )
