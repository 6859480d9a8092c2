"""Free disk space against what the run will write: its checkpoints and the final save (PF037).

A full disk found by the first checkpoint costs the steps before it, and a checkpoint cut short by ENOSPC
is what `latest` must then skip. The sizes are estimated from the model's config.json without torch
(Llama-style linears; the planner's byte counts per parameter): an estimate, so only a clear shortfall is
an error; not room for every checkpoint the run keeps is a warning.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.planner.host import GiB
from fsdp_tune.planner.weights import DTYPE_BYTES

LORA_PARAM_BYTES = 4  # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype); a checkpoint saves them so
ADAM_BYTES = 8  # AdamW's exp_avg and exp_avg_sq, fp32, in every checkpoint's optimizer state


def layer_linears(config: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of one decoder layer's linears, Llama-style (most decoder LMs are close)."""
    h = int(config.get("hidden_size") or config.get("n_embd") or 0)
    inter = int(config.get("intermediate_size") or 4 * h)
    heads = int(config.get("num_attention_heads") or config.get("n_head") or 1)
    kv = int(config.get("num_key_value_heads") or heads)
    hd = int(config.get("head_dim") or h // max(heads, 1))
    return {
        "q_proj": (h, heads * hd),
        "k_proj": (h, kv * hd),
        "v_proj": (h, kv * hd),
        "o_proj": (heads * hd, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }


def sizes(cfg: RunConfig, spec: RankSpec, config: dict) -> tuple[float, float]:
    """(bytes of one checkpoint, bytes of the final save)."""
    linears = layer_linears(config)
    layers = int(config.get("num_hidden_layers") or config.get("n_layer") or 0)
    h, vocab = linears["q_proj"][0], int(config.get("vocab_size") or 0)
    if spec.lora:
        targets = spec.lora.target_modules
        names = list(linears) if targets == "all-linear" else [t.split(".")[-1] for t in targets]
        named = [linears[n] for n in names if n in linears] or list(linears.values())  # unknown names: all
        trainable = layers * sum(spec.lora.r * (i + o) for i, o in named)
        return trainable * (LORA_PARAM_BYTES + ADAM_BYTES), trainable * LORA_PARAM_BYTES
    heads = 1 if config.get("tie_word_embeddings") else 2
    total = vocab * h * heads + layers * (sum(i * o for i, o in linears.values()) + 2 * h)
    weight = DTYPE_BYTES.get(spec.model.dtype, 4)
    return total * (weight + ADAM_BYTES), total * weight


def kept_checkpoints(spec: RankSpec) -> int:
    """How many checkpoints the run holds at once at most (1 when that cannot be told in advance)."""
    s = spec.steps
    if s.save_strategy == "no":
        return 0
    planned = 1
    steps, every = max(s.max_steps, 0), s.save_steps
    if s.save_strategy == "steps" and steps > 0 and every:
        planned = max(1, int(1 / every) if every < 1 else steps // int(every))
    limit = s.save_total_limit
    return min(planned, limit) if limit else planned


def check_disk(cfg: RunConfig, spec: RankSpec) -> list[Finding]:
    config = spec.model.facts.config
    if not config or not config.get("hidden_size") and not config.get("n_embd"):
        return []
    one, final = sizes(cfg, spec, config)
    kept = kept_checkpoints(spec)
    existing = Path(spec.output_dir)
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return []
    if free < one * min(kept, 1) + final:
        return [
            _finding(
                Severity.ERROR, existing, free, f"one checkpoint (~{_gib(one)}) and the final save (~{_gib(final)})"
            )
        ]
    if free < one * kept + final:
        return [
            _finding(
                Severity.WARNING,
                existing,
                free,
                f"the {kept} checkpoints the run keeps (~{_gib(one)} each) and the final save (~{_gib(final)})",
            )
        ]
    return []


def _finding(severity: Severity, where: Path, free: float, need: str) -> Finding:
    return Finding(
        "PF037",
        severity,
        "--output_dir",
        "command line",
        f"{where} has {_gib(free)} free, less than {need}: the run would stop on a full disk",
        "free some space, choose another --output_dir, or keep fewer checkpoints (--save_total_limit N)",
    )


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 100 else f"{n / 2**20:.1f} MiB"
