"""The code path a run takes, as far as memory goes: which loss, which FSDP, which dtypes, which kernels.

fsdp-tune's own path is derived from the typed config (`stack_of`). A public measurement made on another
stack (an older transformers, FSDP1 through another launcher, bitsandbytes 0.43, pure bf16) names its
differences in benchmarks/data/public_memory.yaml, so the planner is checked against what that run
allocated, with nothing fitted: every field below selects a term whose bytes come from reading the code.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import compute_precision, gradient_checkpointing, model_of
from fsdp_tune.sources.classes import chosen_attention
from fsdp_tune.sources.model import ModelFacts

# Bytes per logit (T x V) at the end of the forward and at the start of the backward, for the loss paths
# that materialise full logits; c is the compute dtype's size. Derivations (read, and the installed ones
# measured on CPU in tests/lib/test_planner_terms.py):
# hf_trainer: transformers >= 4.45 `ForCausalLMLoss` under Trainer: logits (c, kept by the output), fp32
#   upcast (4, not when c = 4), log_softmax output (4, saved); Trainer drops the output before backward, which
#   then holds the saved output, nll_loss's dense grad and log_softmax's grad: 12.
# hf_trainer_shift: transformers <= 4.44 `LlamaForCausalLM`: fp32 logits in the output (4), the shifted
#   `.contiguous()` copy (4), log_softmax output (4); backward as above (the slice's zero-filled grad comes
#   after log_softmax's inputs are freed): 12.
# hf_trainer_upcast_shift: transformers 4.46-4.49 `ForCausalLMLoss`: the output's logits (c), the fp32 upcast
#   (4) and its shifted `.contiguous()` copy (4), log_softmax output (4); backward 12.
# loop_keeps_output_shift: the same in a training loop that keeps the output object through backward
#   (Answer.AI's train.py): + the fp32 logits (4) at backward.
# fp32_logits_kept: a model that returns `output(h).float()` kept by the loop through backward (torchtune
#   2024-04/05): forward fp32 logits + log_softmax output; backward + the two grads.
# chunked_ce: torchtune's CEWithChunkedOutputLoss (8 chunks, upcast per chunk): bf16 logits kept (2) and all
#   log_softmax outputs (4), one chunk's fp32 temporaries (3 x 4 / 8) at a time.
FULL_LOGIT_PATHS = {
    "hf_trainer": (lambda c: c + (4 if c < 4 else 0) + 4, lambda c: 12.0),
    "hf_trainer_shift": (lambda c: 12.0, lambda c: 12.0),
    "hf_trainer_upcast_shift": (lambda c: c + 4 + 4 + 4, lambda c: 12.0),
    "loop_keeps_output_shift": (lambda c: 12.0, lambda c: 16.0),
    "fp32_logits_kept": (lambda c: 8.0, lambda c: 16.0),
    "chunked_ce": (lambda c: 6.5, lambda c: 7.5),
}
ATTENTION = ("flash", "sdpa", "eager")
CHECKPOINTING = ("full", "selective", "none")


@dataclass(frozen=True)
class Stack:
    loss: str = "trl_fused"  # TRL 1.16's chunked fused LM head: no full logits (see terms.loss_bytes)
    fsdp_version: int = 2
    compute_bytes: int = 2  # activations: 2 under bf16/fp16, 4 in fp32
    pure_bf16: bool = False  # trainable weights, grads and AdamW in bf16 (8 B/param) instead of fp32 (16)
    base_dtype_bytes: float | None = None  # the frozen base as FSDP holds it; None: the config's model dtype
    bnb_saves_input: bool = False  # bitsandbytes <= 0.43: MatMul4Bit saved its input for backward
    attention: str = "sdpa"
    repeat_kv: bool = False  # SDPA of transformers <= 4.40 (or with a padding mask) repeats k/v to all heads
    checkpointing: str = "full"
    device: str = "cuda"  # "cpu": dropout masks in the compute dtype, TRL's fused head without Triton
    all_gather_stream_pool: bool = True  # FSDP's all-gather buffers live in their own stream's cache
    foreach_adam: bool = False  # AdamW without fused=True: one trainable-shard-sized temporary at the step
    quant_consts_sharded: bool = False  # torchao's NF4Tensor shards its scalers with the weight; bnb does not

    @property
    def trainable_bytes(self) -> int:
        """Weights, grads and AdamW's two moments per trainable parameter."""
        return 8 if self.pure_bf16 else 16


def stack_of(cfg: RunConfig, on_cpu: bool = False, model: ModelFacts | None = None) -> Stack:
    """fsdp-tune's own path for this config; `model`: the model's facts as decided (a shape's), else found as decide
    finds them."""
    label_smoothing = float(cfg.training.get("label_smoothing_factor") or 0)
    m = cfg.model  # the attention the ranks load (eager where the class has no SDPA: Gemma 2)
    config = (model if model is not None else model_of(cfg)).config
    attn = chosen_attention(config, m.attn_implementation, m.use_flash_attn) or "sdpa"
    attn = "flash" if attn.startswith("flash") else attn if attn in ATTENTION else "sdpa"
    checkpointing = cfg.fsdp.activation_checkpointing or gradient_checkpointing(cfg)
    return Stack(
        # TRL computes the loss from full logits when label smoothing is on (sft_trainer.py:1593-1609)
        loss="hf_trainer" if label_smoothing > 0 else "trl_fused",
        fsdp_version=cfg.fsdp.version,
        compute_bytes=2 if compute_precision(cfg) in ("bf16", "fp16", "fp8") else 4,
        attention=attn,
        checkpointing="full" if checkpointing else "none",
        # TRL's default optim is adamw_torch_fused (torch >= 2.8); adamw_torch runs the foreach kernels
        foreach_adam=str(cfg.training.get("optim") or "") == "adamw_torch",
        # QLoRA's adapters train in bf16: SFTTrainer casts them for a quantized model and accelerate upcasts trainable
        # parameters only without 4-bit weights (worker/loading/sharded.py _with_lora): weights, grads and AdamW 8 B
        pure_bf16=cfg.lora.use_peft_lora and cfg.quantization.use_4bit_quantization,
        device="cpu" if on_cpu else "cuda",
        all_gather_stream_pool=not on_cpu,
    )
