"""What a training method changes in a step, for the memory plan and the step time (pure, read from TRL 1.16).

    sft     B rows per micro-batch, forward with gradients, backward
    dpo     chosen and rejected rows concatenated: 2B rows with gradients (dpo_trainer.py _compute_loss); then a
            reference forward on the same 2B rows under no_grad (the "ref" adapter, or adapters off), while the
            policy's activations are kept: one more all-gather pass per step, nothing saved for backward
    kto     B rows with gradients; a KL forward of the policy before it and the reference's KL and main forwards
            after it, each B rows under no_grad (kto_trainer.py forward / compute_ref_log_probs): three more passes
    reward  chosen and rejected: 2B rows with gradients through a one-number score head (no vocabulary logits;
            the model has no LM head)
    grpo    B rows with gradients as SFT's; the generation and the log-prob passes before it (planner/generating.py)

The no-grad forwards free each layer's tensors as the next one consumes them: at most one layer's worth is alive
at once (bounded here by what the layer saves for backward, an upper bound) beside the kept activations.
"""

from __future__ import annotations

from fsdp_tune.config.methods import Step, row_of
from fsdp_tune.config.schema import RunConfig

REFERENCE_PHASE = "reference forward (no grad)"


def step_of(cfg: RunConfig) -> Step:
    """The method's step (config/methods.py: its row)."""
    return row_of(cfg.run.method).step


def note(cfg: RunConfig) -> str | None:
    """One line for the plan naming the method's step (None for SFT)."""
    if row_of(cfg.run.method).generates:
        from fsdp_tune.planner import generating

        return generating.note(cfg)
    step = step_of(cfg)
    return f"{cfg.run.method}: {step.describe}" if step.describe else None


def loss_terms(cfg: RunConfig, tokens: int, hidden: int, fused: tuple[float, float]) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of the loss: TRL's fused head (`fused`, from terms.loss_bytes) or,
    for a reward model, the final norm's fp32 input and the score head's (tokens x 1) output only."""
    if row_of(cfg.run.method).head == "lm":
        return fused
    final_norm = 4 * tokens * hidden
    return final_norm + 4 * tokens, final_norm + 8 * tokens


def reference_phase(
    cfg: RunConfig,
    phase: dict[str, float],
    tokens_with_grad: int,
    layer_bytes: float,
    loss_fwd,
    head_bytes: float,
    forwards: list[dict[str, float]] = (),
):
    """The no-grad forwards' phase (None for methods without one): the largest of their moments, each while the
    policy's forward waits for its backward (`phase`: its end, with the kept activations and the loss), beside
    the copy of lm_head's gathered weight TRL's fused head saved for that backward (`head_bytes`). Held to
    `plan --trace` (BENCHMARKS section 9):
    - FSDP2's forward moments again (`forwards`: the embedding's forward, the first and the last layer's
      copy-out, already with the policy's kept activations), plus that saved weight; without them, the end of the
      forward without its loss plus one layer's tensors for the no-grad rows (`layer_bytes` per token);
    - at the head: the end of the policy's forward, lm_head's weight gathered again beside the saved copy, and the
      reference's log-probs (`loss_fwd(tokens)`)."""
    step = step_of(cfg)
    if not step.no_grad_forwards:
        return None
    tokens = tokens_with_grad // step.rows_with_grad * step.no_grad_rows
    saved = "lm_head's weight, saved for the policy's backward"
    moments = [{**moment, saved: head_bytes} for moment in forwards]
    if not moments:
        in_layer = {k: v for k, v in phase.items() if k != "logits and loss"}
        in_layer["reference forward: one layer (no grad)"] = tokens * layer_bytes
        moments.append(in_layer)
    at_head = dict(phase)
    at_head["reference forward: lm_head's weight gathered again"] = head_bytes
    at_head["reference forward: its log-probs"] = loss_fwd(tokens)
    return max([*moments, at_head], key=lambda moment: sum(moment.values()))
