"""What one decoder layer, the loss and the 4-bit matmuls allocate, per token or per step: the terms the
memory plan adds up. Each is derived op by op from the code the ranks run (transformers' Llama-family
layer, PEFT's LoRA Linear, TRL's fused LM head, bitsandbytes' MatMul4Bit) and checked on CPU against what
autograd actually saves and what a step's peak actually is (tests/lib/test_planner_terms.py).

Notation: h hidden, q = heads x head_dim, kv = kv heads x head_dim, i the MLP width a token uses (top_k
experts' under MoE), c the compute dtype's bytes, r the LoRA rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import FULL_LOGIT_PATHS, Stack

TRL_TOKEN_CHUNK = 4096  # trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE
TRL_VOCAB_CHUNK = 32768  # trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE
TRL_PER_TOKEN_VECTORS = 7  # fp32 running max, sums, target logit, ... (chunked_logprob.py:340-346)
TRL_CPU_TILE_COPIES = 4  # without Triton: fp32 copies of a tile alive at once in _forward/_backward_tile
BNB_CUSTOM_GEMM_MAX_TOKENS = 1536  # bitsandbytes' 4-bit kernel path without dequantizing (backends/cuda/ops.py)


@dataclass(frozen=True)
class Adapters:
    """What trains in a layer: LoRA on some linears (by leaf name), or every weight (full fine-tuning)."""

    targets: frozenset[str] = frozenset()
    r: int = 0
    dropout: float = 0.0
    dora: bool = False
    full: bool = False

    def trains(self, leaf: str) -> bool:
        return self.full or "all-linear" in self.targets or leaf in self.targets


# the distinct tensors a layer's linears read: input name -> leaf names of the linears that read it
LINEAR_INPUTS = {
    "attn_in": ("q_proj", "k_proj", "v_proj"),
    "attn_out": ("o_proj",),
    "mlp_in": ("gate_proj", "up_proj"),
    "mlp_mid": ("down_proj",),
}


def _input_width(shape: ModelShape, name: str) -> int:
    return {"attn_in": shape.hidden_size, "attn_out": shape.q_dim, "mlp_in": shape.hidden_size}.get(
        name, shape.mlp_width
    )


def layer_saved(shape: ModelShape, st: Stack, ad: Adapters, seq_len: int, quantized: bool = False) -> float:
    """Bytes per token that one decoder layer saves for backward (all of it without checkpointing; what the
    recompute materialises with it). The layer's input is not counted (it is the previous layer's output, or
    what checkpointing keeps). Long because it is one account, term by term, of the layer's forward."""
    c, h, q, kv = st.compute_bytes, shape.hidden_size, shape.q_dim, shape.kv_dim
    i = shape.mlp_width
    # RMSNorm upcasts its input and saves the fp32 tensor (pow, mul) and the fp32 rsqrt (T x 1); with fp32
    # compute the first norm's input is the layer input itself (no copy)
    saved = shape.n_norms * (4 * h + 4) - (4 * h if c == 4 else 0)
    if ad.full:  # a trained norm weight makes the mul save the normalised output too
        saved += shape.n_norms * c * h
    # attention core (flash / SDPA): q, k, v after RoPE, the output, fp32 logsumexp per head
    kv_saved = q if st.repeat_kv else kv
    saved += c * (2 * q + 2 * kv_saved) + 4 * shape.n_heads
    if st.attention == "eager":  # fp32 softmax output and its cast, per head and key
        saved += shape.n_heads * seq_len * (4 + c)
    # MLP: SwiGLU saves the gate output (SiLU input), the SiLU output and the up output; fused MoE experts
    # save the gate_up output (2I), the SiLU output (I) and the down output (h, for the routing weight)
    saved += c * 3 * i + (c * h * shape.top_k if shape.n_experts else 0)
    saved += _linear_inputs(shape, st, ad, quantized)
    return saved


def mlp_saved(shape: ModelShape, st: Stack, ad: Adapters, quantized: bool = False) -> float:
    """Bytes per token of layer_saved that the layer's MLP half saves (its norm, SwiGLU's or the experts' saves, its
    linears' inputs): freed by the time the layer's backward reaches the attention."""
    c, h = st.compute_bytes, shape.hidden_size
    saved = 4 * h + 4 + (c * h if ad.full else 0)  # the post-attention norm (layer_saved: every norm hidden-wide)
    saved += c * 3 * shape.mlp_width + (c * h * shape.top_k if shape.n_experts else 0)
    return saved + _linear_inputs(shape, st, ad, quantized, ("mlp_in", "mlp_mid"))


def _linear_inputs(
    shape: ModelShape, st: Stack, ad: Adapters, quantized: bool, names: tuple[str, ...] = tuple(LINEAR_INPUTS)
) -> float:
    """Inputs saved because a matmul's weight trains (LoRA's A, or every weight), or because bitsandbytes
    <= 0.43 saved them. One copy per distinct input tensor when nothing drops it out; with LoRA dropout each
    adapter saves its own dropped copy and the mask (bool on CUDA, the compute dtype on CPU). The attention
    output that o_proj reads is the tensor the attention kernel saved already. `names`: the inputs counted."""
    c = st.compute_bytes
    mask = c if st.device == "cpu" else 1
    saved = 0.0
    for name, leaves in ((n, LINEAR_INPUTS[n]) for n in names):
        if shape.n_experts and name in ("mlp_in", "mlp_mid"):
            continue  # fused experts are no Linear: counted with the MLP
        width = _input_width(shape, name)
        lora = [leaf for leaf in leaves if not ad.full and ad.trains(leaf)]
        shared = ad.full or (lora and ad.dropout == 0) or (quantized and st.bnb_saves_input)
        if shared and name != "attn_out":
            saved += c * width
        if lora and ad.dropout > 0:
            saved += len(lora) * (c + mask) * width
        if lora:  # lora_B saves lora_A's output; DoRA's magnitude multiply saves two outputs
            saved += len(lora) * c * ad.r
            if ad.dora:
                saved += 2 * c * sum(_out_width(shape, leaf) for leaf in lora)
    return saved


def _out_width(shape: ModelShape, leaf: str) -> int:
    widths = {"q_proj": shape.q_dim, "k_proj": shape.kv_dim, "v_proj": shape.kv_dim, "o_proj": shape.hidden_size}
    return widths.get(leaf, shape.hidden_size if leaf == "down_proj" else shape.intermediate_size)


def layer_backward_transients(shape: ModelShape, st: Stack, seq_len: int = 0) -> float:
    """Bytes per token of the gradient buffers alive together in one layer's backward, beyond the saved
    activations: the MLP's product, SiLU and up gradients (3 x i) with the incoming and the accumulating
    residual-stream gradients (2 x h). Under MoE one expert's tokens at a time: at most every token's.
    Eager attention adds, per head and key, the fp32 gradient of the probabilities (cast up from the compute
    dtype) and softmax's fp32 backward output, alive together."""
    i = shape.intermediate_size if shape.n_experts else shape.mlp_width
    eager = shape.n_heads * seq_len * (4 + 4) if st.attention == "eager" else 0
    return st.compute_bytes * (3 * i + 2 * shape.hidden_size) + eager


def checkpoint_kept(shape: ModelShape, st: Stack) -> float:
    """Bytes per token per layer that activation checkpointing keeps: the layer's input hidden states
    (reentrant: ctx.save_for_backward of the inputs; non-reentrant: the same tensor behind the saved-tensor
    hooks). The rotary cos/sin and the mask are shared by every layer. Selective (torchtitan's op-level
    policy, activation_checkpoint.py: SDPA's outputs and every other matmul of a layer, counted from the
    layer's start) also keeps wq's, wv's, wo's and w2's outputs and the attention output with its fp32 lse."""
    c, h = st.compute_bytes, shape.hidden_size
    if st.checkpointing == "selective":
        return c * (h + shape.q_dim + shape.kv_dim + h + h + shape.q_dim) + 4 * shape.n_heads
    return c * h


def loss_bytes(tokens: int, shape: ModelShape, st: Stack, head_trains: bool = False) -> tuple[float, float]:
    """(end of forward, start of backward) bytes of the logits and loss, beyond the final hidden states."""
    c, h, v = st.compute_bytes, shape.hidden_size, shape.vocab_size
    final_norm = 4 * tokens * h  # the final RMSNorm's fp32 input, saved
    if st.loss in FULL_LOGIT_PATHS:
        fwd, bwd = FULL_LOGIT_PATHS[st.loss]
        return final_norm + tokens * v * fwd(c), final_norm + tokens * v * bwd(c)
    # TRL's fused head: a copy of the labelled hidden states (saved), one matmul tile of at most 4096 tokens x
    # 32768 vocabulary entries, per-token fp32 vectors; backward: fp32 grad_hidden and its cast, a new tile,
    # fp32 grad of the head's weight when it trains
    tile = min(tokens, TRL_TOKEN_CHUNK) * min(v, TRL_VOCAB_CHUNK)
    tile_bytes = tile * (c + (TRL_CPU_TILE_COPIES * 4 if st.device == "cpu" else 0))
    vectors = TRL_PER_TOKEN_VECTORS * 4 * tokens
    fwd = final_norm + tokens * h * c + tile_bytes + vectors
    bwd = final_norm + tokens * h * (c + 4 + c) + tile_bytes + vectors + (4 * v * h if head_trains else 0)
    return fwd, bwd


def dequant_bytes(shape: ModelShape, st: Stack, tokens: int) -> float:
    """The dequantized weight of the 4-bit linear that is running (one at a time), with its fp32 absmax
    temporaries (N*K/64 x 4 twice); none when bitsandbytes takes its custom kernel (few tokens, CUDA)."""
    if st.device == "cuda" and tokens <= BNB_CUSTOM_GEMM_MAX_TOKENS:
        return 0.0
    biggest = max((lin.in_features * lin.out_features for lin in shape.layer_linears), default=0)
    return biggest * (st.compute_bytes + 8 / 64)


def quantized_backward(shape: ModelShape, st: Stack, tokens: int) -> tuple[float, float]:
    """(gradients alive, dequantized weight) while a 4-bit MLP linear runs its backward: bitsandbytes'
    MatMul4Bit.backward dequantizes the weight for the input's gradient on every path (functional.dequantize_4bit:
    the fp32 absmax, offset in place, and the [out, in] weight), fused forward kernel or not; beside it the
    incoming gradient and two MLP-width ones (h + 2 i). The layer's other backward transients are freed by then
    (layer_backward_transients counts them alive together): the larger of the two moments is the layer's peak. The
    recompute's forward dequantizes as well past the fused kernel's range (dequant_bytes), at most as much."""
    i = shape.intermediate_size if shape.n_experts else shape.mlp_width
    biggest = max((lin.in_features * lin.out_features for lin in shape.layer_linears), default=0)
    dequantized = max(biggest * (st.compute_bytes + 4 / 64), dequant_bytes(shape, st, tokens))
    return tokens * st.compute_bytes * (2 * i + shape.hidden_size), dequantized


def ring_attention(shape: ModelShape, st: Stack, tokens: int, cp: int, strategy: str = "allgather") -> float:
    """Bytes one attention layer's ring backward holds beyond the saved activations, under context parallelism
    (torch/distributed/tensor/experimental/_context_parallel/_attention.py, _templated_ring_attention_backward),
    for `tokens` local tokens (this rank's 1/cp of the sequence): the K/V blocks in flight, `allgather`
    (accelerate's default cp_comm_strategy: _AllGatherRotater gathers every rank's K/V, the whole sequence's,
    once) or `alltoall` (_AllToAllRotater: the block in use and the one arriving); dq, dk, dv accumulated in fp32
    (_cp_options.convert_to_f32 is True); the dK/dV blocks rotated back by all-to-all, in fp32, the one sent and
    the one arriving. The forward (and the recompute's) holds less: the same K/V and an fp32 output merger (4 q
    per token), freed before the backward starts. SDPA's flash / memory-efficient kernels (what CP requires,
    FT048) have no s^2 term. These live while the backward is in the attention, after the MLP's (ring_moment)."""
    if cp <= 1:
        return 0.0
    kv_block = 2 * shape.kv_dim * st.compute_bytes  # one token's K and V
    in_flight = (cp if strategy == "allgather" else 2) * kv_block
    grads = 4 * (shape.q_dim + 2 * shape.kv_dim)
    rotated = 2 * 4 * 2 * shape.kv_dim
    return tokens * (in_flight + grads + rotated)


def ring_moment(shape: ModelShape, st: Stack, ad: Adapters, tokens: int, quantized: bool) -> tuple[float, float]:
    """(saved activations, gradients) beside the ring's buffers (ring_attention) while a layer's backward runs its
    ring attention: the recomputed layer's saves less its MLP's (freed once the backward has passed the MLP), the
    residual stream's incoming and accumulating gradients. The layer's backward peaks here or in the MLP
    (layer_backward_transients), whichever is larger (what `plan --trace` measures under context parallelism)."""
    saved = layer_saved(shape, st, ad, 0, quantized) - mlp_saved(shape, st, ad, quantized)
    return tokens * saved, tokens * 2 * st.compute_bytes * shape.hidden_size


def ring_bytes_sent(shape: ModelShape, st: Stack, tokens: int, cp: int, forwards: int) -> float:
    """Bytes one rank sends around the ring for one micro-batch (`tokens` local tokens), every attention layer:
    its K/V block to the cp - 1 others in each forward (`forwards`: 2 with activation checkpointing's recompute),
    again in the backward, and the fp32 dK/dV block cp times (_templated_ring_attention_backward sends it at every
    step of the ring, the last one home). The all-gather strategy moves the same bytes as the ring's cp - 1
    sends."""
    if cp <= 1:
        return 0.0
    kv_block = tokens * 2 * shape.kv_dim * st.compute_bytes
    grad_block = tokens * 2 * shape.kv_dim * 4
    return shape.n_layers * ((cp - 1) * (forwards + 1) * kv_block + cp * grad_block)
