"""Throughput as the field reports it (benchmarks/gpu_check.py): tokens per second over the steady steps, MFU at 4N
FLOPs a token for LoRA against the GPU's dense bf16 peak, the recompute's extra work said apart, and NeMo
AutoModel's published Llama-3-8B LoRA figure beside it. No torch.

LoRA on a frozen base costs 4N FLOPs a token: forward 2N + the activations' gradients 2N; the base's weight
gradients (another 2N in full fine-tuning's 6N) are never computed; N the base model's parameters, embeddings
included; attention's own FLOPs not counted. Recomputing the layers (activation checkpointing) makes the GPU do
another forward, +2N: MFU stays at 4N (the work the model needs), and the hardware's share is said beside it.
"""

from __future__ import annotations

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "4090": 165.0, "L40S": 362.0}  # dense bf16
# NeMo AutoModel's "Fine-Tuning (LoRA) Performance" table, DGX-H100 BF16 (docs.nvidia.com/nemo/automodel,
# performance-summary; recipe examples/llm_finetune/llama3_1/llama3_1_8b_peft_benchmark.yaml): Llama-3.1-8B,
# 1 GPU, GBS 32, MBS 2 (16 accumulation steps), seq 4096, FSDP2, LoRA dim 16 alpha 32 dropout 0.1 on every linear
# layer, mock data of full 4096-token rows, 10.51 s a global step, 402 model TFLOP/s/GPU as they count it.
NEMO_LLAMA3_8B_LORA = {
    "tokens_per_s": 12472.87,
    "model_tflops": 402.0,
    "n_params": 8_030_261_248,
    "gpu": "H100",
    "seq": 4096,
    "micro_batch": 2,
    "global_batch": 32,
}


def peak_tflops(gpu_name: str) -> float | None:
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu_name), None)


def tokens_per_s(rows: list[dict], warmup: int) -> float | None:
    """Tokens a second over the steps after `warmup` (at least one step of warm-up: the first step's start is not
    logged)."""
    timed = [r for r in rows if "loss" in r and "num_tokens" in r and "time" in r]
    start = max(warmup, 1) - 1
    if len(timed) < start + 2:
        return None
    first, last = timed[start], timed[-1]
    return (last["num_tokens"] - first["num_tokens"]) / max(last["time"] - first["time"], 1e-9)


def mfu(tps: float | None, n_params: int, recompute: bool, peak: float | None, world: int) -> dict:
    """{"mfu": at 4N, "hardware": with the recompute's 2N (= mfu without recompute), "formula": the line}."""
    size = f"N={n_params / 1e9:.2f}B" if n_params >= 1e8 else f"N={n_params / 1e6:.2f}M"
    text = f"4N FLOPs/token ({size}: forward 2N + activation gradients 2N)"
    if not (tps and n_params and peak):
        return {"mfu": None, "hardware": None, "formula": text + ("; no GPU peak here" if not peak else "")}
    value = tps * 4 * n_params / (peak * 1e12 * world)
    hardware = value * (6 / 4 if recompute else 1.0)
    formula = f"{tps:,.0f} tok/s x {text} / ({peak:.0f} TFLOP/s x {world} GPU) = {value:.1%}"
    formula += (
        f"; recompute on: the GPU also redoes the forward (+2N), {hardware:.1%} of its peak"
        if recompute
        else "; no recompute"
    )
    return {"mfu": value, "hardware": hardware, "formula": formula}


def nemo_comparison(tps: float | None, value: float | None, gpu_name: str, shape: dict) -> list[str]:
    """This run beside NeMo AutoModel's published figure, at the same shape, with what differs."""
    ref = NEMO_LLAMA3_8B_LORA
    theirs = ref["tokens_per_s"] * 4 * ref["n_params"] / (989e12)
    lines = [
        f"NeMo AutoModel, Llama-3-8B LoRA on one {ref['gpu']}: {ref['tokens_per_s']:,.0f} tok/s, {theirs:.1%} at 4N "
        f"({ref['model_tflops']:.0f} TFLOP/s as they count it: {ref['model_tflops'] / 989:.1%})",
        f"fsdp-tune here ({gpu_name}): "
        + (f"{tps:,.0f} tok/s, {value:.1%} at 4N: {tps / ref['tokens_per_s']:.2f}x theirs" if tps and value else "-"),
        f"  same: seq {shape.get('seq')} (theirs {ref['seq']}), micro-batch {shape.get('micro_batch')} (theirs "
        f"{ref['micro_batch']}), LoRA r{shape.get('lora_r')} every linear layer, FSDP2 on 1 GPU; differs: "
        f"global batch {shape.get('global_batch')} (theirs {ref['global_batch']}, 16 accumulation steps), "
        "random weights of the same shape, rows of the check's text cut at the sequence length (theirs mock rows); "
        "an H200 has the H100's 989 TFLOP/s and faster memory (4.8 vs 3.35 TB/s)",
    ]
    return lines
