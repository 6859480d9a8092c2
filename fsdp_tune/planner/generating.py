"""GRPO's step for the memory plan (pure, read from TRL 1.16's GRPOTrainer and transformers 5.24's generate).

One generation serves `steps_per_generation` optimizer micro-steps (by default gradient_accumulation_steps): each rank
generates for per_device_train_batch_size x steps_per_generation prompts-with-completion at once, then trains on
per_device_train_batch_size of them per micro-step, as SFT trains on a batch (TRL's fused head: log-probs and
entropy, no full logits). Around it, two phases SFT has not:

    generation       under no_grad, the policy's own generate() on the sharded model: the KV cache of every row at
                     its full length (prompt + max_completion_length, within max_seq_len; 2 x layers x rows x tokens
                     x key/value width, in the compute dtype), the last position's logits in fp32 with the
                     sampler's copy (temperature, top-k/p: 2 x rows x vocabulary), and FSDP2's units in flight as in
                     a forward (three layers' worth at a copy-out, the output head); the prefill's one-layer tensors
                     for the prompts are bounded by what a layer saves for backward
    log-prob passes  before training and without gradients, in chunks of per_device_train_batch_size rows: the
                     reference's (beta > 0: the same model, adapter off) and the policy's "old" log-probs (when one
                     generation serves several optimizer steps: num_iterations > 1, or steps_per_generation above
                     gradient_accumulation_steps); one layer's tensors, the fused head's tile and the log-probs, and
                     lm_head gathered

Nothing of the generation outlives it: the KV cache is freed before the log-prob passes and the training forward.

How the generation meets the shards is decided here, once (generation_weights; the launcher writes it into the rank
spec, GenerationSpec.weights, and `plan` prints it): "gathered" all-gathers the whole model once per generation
(worker/training/generation.py), where the generation phase with every unit gathered, plus the CUDA context's upper
bound, fits the card; else "sharded", which gathers every unit again for each generated token (three layers and the
head in flight, as above). `--grpo_generation sharded|gathered` overrides the plan.
"""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import shard_group
from fsdp_tune.decide.method import generation_batch, steps, steps_per_generation
from fsdp_tune.planner import gathered
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import Stack

# GRPOConfig's settings as the run gives them, else GRPOConfig's own defaults (TrainingSettings.get reads them from
# the installed TRL: training_fields.json), as decide/method.py generation_spec reads them for the ranks: not
# restated here


def _int(cfg: RunConfig, name: str, unset: int) -> int:
    """A whole-number setting; `unset` only where GRPOConfig's default is None (it derives the value then)."""
    value = cfg.training.get(name)
    return int(value) if value is not None else unset


def completion_length(cfg: RunConfig) -> int:
    """Tokens per completion: max_completion_length, or the whole max_seq_len where it is None (unbounded)."""
    return _int(cfg, "max_completion_length", cfg.data.max_seq_len)


GENERATION = "generation (KV cache, no grad)"
LOG_PROBS = "log-prob passes (reference / old policy, no grad)"


def rows_generated(cfg: RunConfig) -> int:
    """Completions one rank generates at once (GRPOConfig: generation_batch_size / world, or per-device batch x
    steps_per_generation)."""
    return max(generation_batch(cfg)[0] // max(cfg.launch.num_processes, 1), 1)


def _micro_steps_per_generation(cfg: RunConfig) -> int:
    """Micro-steps one generation serves: steps_per_generation (decide/method.py) x num_iterations."""
    return max(steps_per_generation(cfg) * _int(cfg, "num_iterations", 1), 1)


def log_prob_passes(cfg: RunConfig) -> int:
    """Forwards without gradients before training: the reference's (beta > 0) and the old policy's."""
    old = steps(cfg).gradient_accumulation_steps % _micro_steps_per_generation(cfg) != 0
    return int(float(cfg.training.get("beta") or 0) > 0) + int(old)


def sequence(cfg: RunConfig) -> int:
    """A row's length: the prompt and its completion, within max_seq_len (longer prompts are left out)."""
    return cfg.data.max_seq_len


def kv_cache_bytes(cfg: RunConfig, shape: ModelShape, st: Stack) -> float:
    return 2 * shape.n_layers * rows_generated(cfg) * sequence(cfg) * shape.kv_dim * st.compute_bytes


def phases(cfg: RunConfig, shape: ModelShape, st: Stack, u: dict, saved: float, head: float, loss_fwd) -> dict:
    """GRPO's own phases (component -> bytes), beside the training step's. `u`: gathered unit bytes
    (planner/gathered.py units), `saved`: what a layer saves for backward per token, `head`: lm_head gathered
    whole (the fused head), `loss_fwd(tokens)`: the fused head's forward bytes."""
    rows = rows_generated(cfg)
    completion = completion_length(cfg)
    prompt = max(sequence(cfg) - completion, 1)
    out = {
        GENERATION: {
            "KV cache (every layer, prompt + completion)": kv_cache_bytes(cfg, shape, st),
            "last position's logits and the sampler's copy (fp32)": 2 * 4 * rows * shape.vocab_size,
            "prefill: one layer's tensors for the prompts (no grad)": rows * prompt * saved,
            "gathered FSDP units": 3 * u["layer"] + u["head"],
        }
    }
    if log_prob_passes(cfg):
        tokens = steps(cfg).per_device_train_batch_size * sequence(cfg)
        out[LOG_PROBS] = {
            "one layer's tensors (no grad)": tokens * saved,
            "gathered FSDP units": 3 * u["layer"],
            "lm_head gathered (fused head)": head,
            "log-probs": loss_fwd(tokens),
        }
    return out


def note(cfg: RunConfig) -> str:
    n = _int(cfg, "num_generations", 1)
    passes = log_prob_passes(cfg)
    extra = f", {passes} log-prob pass(es) without gradients" if passes else ""
    return (
        f"{cfg.run.method}: {rows_generated(cfg)} completions generated per rank at once ({n} per prompt, up to "
        f"{completion_length(cfg)} tokens), then trained on like SFT rows{extra}"
    )


def generations_per_step(cfg: RunConfig) -> float:
    """Generations per optimizer step: one per steps_per_generation x num_iterations micro-steps."""
    return _int(cfg, "gradient_accumulation_steps", 1) / _micro_steps_per_generation(cfg)


def generation_cost(
    cfg: RunConfig, shape: ModelShape, forward_gathered: float, once: bool = False
) -> tuple[float, float]:
    """(FLOPs, all-gathered bytes) per GPU and optimizer step that GRPO adds to the training pass: each generation
    runs the prefill and one forward per generated token, every forward all-gathering every unit again on the
    sharded policy (`forward_gathered`: one forward's worth), once per generation where it is gathered (`once`:
    generation_weights); the log-prob passes are one forward each per micro-step."""
    completion = completion_length(cfg)
    gens = generations_per_step(cfg)
    accumulation = _int(cfg, "gradient_accumulation_steps", 1)
    micro = _int(cfg, "per_device_train_batch_size", 1)
    n = shape.active_params
    flops = gens * rows_generated(cfg) * sequence(cfg) * 2 * n
    flops += log_prob_passes(cfg) * accumulation * micro * sequence(cfg) * 2 * n
    gathered = (gens * (1 if once else completion + 1) + log_prob_passes(cfg) * accumulation) * forward_gathered
    return flops, gathered


GiB = 2**30


def _size(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def whole_gathered_bytes(cfg: RunConfig, shape: ModelShape, st: Stack) -> float:
    """Every unit gathered at once (as all-gathered: the base in its stored dtype, 4-bit packed for QLoRA, and the
    LoRA weights in the compute dtype); zero on one rank, where the shard is the model (planner/gathered.py units)."""
    u = gathered.units(cfg, shape, st, shard_group(cfg))
    return shape.n_layers * u["layer"] + u["root"]


def generation_weights(
    cfg: RunConfig, shape: ModelShape, st: Stack, phases: dict[str, float], budget_gib: float | None, context_gib: float
) -> dict:
    """Gathered once per generation, or sharded: the generation phase's total (`phases[GENERATION]`: the static
    state, the KV cache, the sampler's logits) with the whole model gathered in place of the units in flight,
    plus `context_gib` (the CUDA context's upper bound), against the card's `budget_gib` (None: a CPU run).
    Returns the decision with the figures that made it (`plan --json`'s grpo_generation)."""
    asked = cfg.run.grpo_generation
    whole = whole_gathered_bytes(cfg, shape, st)
    u = gathered.units(cfg, shape, st, shard_group(cfg))
    generation = phases.get(GENERATION, 0.0)
    need = generation - (3 * u["layer"] + u["head"]) + whole
    out = {"asked": asked, "gathered_model_gib": round(whole / GiB, 2), "generation_gathered_gib": round(need / GiB, 2)}
    out["generation_sharded_gib"] = round(generation / GiB, 2)
    out["budget_gib"] = budget_gib
    if cfg.training.get("use_vllm"):
        return {
            **out,
            "weights": "sharded",
            "why": "vLLM generates (--use_vllm): the policy's own generate() is unused",
        }
    if cfg.fsdp.version == 1:
        return {**out, "weights": "sharded", "why": "FSDP1: its units have no unshard(), every unit gathered per token"}
    figures = f"{_size(need)} with the model gathered ({_size(whole)} of it)"
    if budget_gib is None:
        fits, where = True, f"CPU ranks: {figures} of host memory a rank"
    else:
        fits = need / GiB + context_gib <= budget_gib
        where = f"{figures} + {context_gib:g} GiB CUDA context {'fits' if fits else 'exceeds'} {budget_gib:.1f} GiB"
    if asked != "auto":
        return {**out, "weights": asked, "why": f"--grpo_generation {asked} (the plan: {where})"}
    if shard_group(cfg) <= 1:
        return {**out, "weights": "gathered", "why": "one rank: its shard is the whole model, nothing is re-gathered"}
    return {**out, "weights": "gathered" if fits else "sharded", "why": where}
