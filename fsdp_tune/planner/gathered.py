"""The FSDP units in flight: their bytes as all-gathered, and the phases of a step that FSDP2's all-gathers shape.

Read from torch 2.13's FSDP2 (_fully_shard/_fsdp_param_group.py, _fsdp_state.py) and checked against the trace of
the step (`plan --trace`, benchmarks/trace_grid.py), which executes that code:
- forward copy-out: wait_for_unshard keeps the previous unit's all-gather output (comm_ctx.all_gather_state) until
  this unit's copy-out is done, to overlap it with the next all-gather: at that moment three units' worth, the
  previous output, this one and its unsharded copy. The last layer's output is held until the root's post-forward,
  through TRL's fused head and loss (they run inside the model's forward).
- the input embedding (a unit of its own unless tied): its output and its unsharded copy at its forward; at layer
  0's copy-out the embedding's output beside layer 0's two.
- backward: layer 0's pre-backward prefetches the unit before it in forward order, the frozen embedding (its
  all-gather runs although nothing in backward uses it), held to the end of backward; with short sequences layer
  0's backward is then the step's peak.
- without resharding after forward (and for the tied [norm, embedding, head] tail unit, never resharded before
  backward) the embedding stays gathered from its forward on.
"""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.planner.shape import ModelShape
from fsdp_tune.planner.stack import Stack
from fsdp_tune.planner.weights import base_bytes, lora_on_rank

EMBEDDING = "input embedding (start of forward)"
FIRST_FORWARD = "first layer's forward (all-gather copy-out)"
LAST_FORWARD = "last layer's forward (all-gather copy-out)"
FIRST_BACKWARD = "first layer's backward"
GATHERED = "gathered FSDP units"


def units(cfg: RunConfig, shape: ModelShape, st: Stack, world: int) -> dict[str, float]:
    """Bytes of one gathered decoder layer (its LoRA as FSDP2 pads it), and of the edge units, as all-gathered
    (param dtype = compute). Zero on one rank: nothing is gathered."""
    if world <= 1:
        return {"layer": 0.0, "head": 0.0, "root": 0.0, "embed": 0.0}
    c = st.compute_bytes
    layer = base_bytes(cfg, shape)[1] if cfg.quantization.use_4bit_quantization else shape.layer_params * c
    layer += lora_on_rank(cfg, shape, world, st.fsdp_version)[1] * c
    head = (shape.head_params or shape.embedding_params) * c  # the lm_head (or the tied embedding)
    root = (shape.embedding_params + shape.head_params + shape.other_params) * c
    return {"layer": layer, "head": head, "root": root, "embed": shape.embedding_params * c}


def resharded(cfg: RunConfig) -> bool:
    if cfg.fsdp.version == 1 and cfg.fsdp.sharding_strategy in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2", "NO_SHARD"):
        return False
    return cfg.fsdp.reshard_after_forward


def embedding_held(shape: ModelShape, u: dict[str, float], resharded_: bool) -> float:
    """FSDP2: the embedding gathered from its forward to the end of backward (tied, or not resharded)."""
    return u["embed"] if shape.tied_head or not resharded_ else 0.0


def edges(st: Stack, shape: ModelShape, u: dict, resharded_: bool, fsdp2: bool) -> tuple[float, float, float]:
    """(gathered all step: FSDP1's root unit, FSDP2's embedding when tied or not resharded; the head's weight from
    the loss's forward to its backward: FSDP1's root unit, under FSDP2 TRL's fused head all-gathers lm_head's weight
    (full_tensor) and saves it, a tied one is the gathered embedding itself; the last layer's all-gather output,
    which FSDP2 holds through the loss until the root's post-forward)."""
    if st.fsdp_version == 1:
        return u["root"], u["root"], 0.0
    resident = embedding_held(shape, u, resharded_)
    head = 0.0 if shape.tied_head and fsdp2 else u["head"]
    return resident, head + resident, u["layer"] if fsdp2 else 0.0


def fsdp2_phases(phases: dict, last_backward: str, kept_name: str, u: dict, shape: ModelShape, resharded_: bool):
    """The phases FSDP2's all-gathers add: the embedding's forward, layer 0's and the last layer's forward copy-out,
    layer 0's backward (the last layer's backward with one layer's activations kept, layer 0 and the prefetched
    or still gathered embedding). `phases[last_backward]` is the last layer's backward."""
    bw = phases[last_backward]
    kept, layer, embed = bw.get(kept_name, 0.0), u["layer"], u["embed"]
    held = embedding_held(shape, u, resharded_)
    in_flight = 3 * layer if resharded_ else (shape.n_layers + 2) * layer
    one = kept / shape.n_layers
    return {
        EMBEDDING: {kept_name: one, GATHERED: 2 * embed},
        FIRST_FORWARD: {kept_name: one, GATHERED: embed + held + 2 * layer},
        LAST_FORWARD: {kept_name: kept, GATHERED: held + in_flight},
        FIRST_BACKWARD: {**bw, kept_name: one, GATHERED: layer + embed},
    }


def no_grad_forwards(phases: dict, kept_name: str, kept: float, n_layers: int, scale: float) -> list[dict]:
    """FSDP2's forward moments (the embedding's forward, the first and the last layer's copy-out) in a no-grad
    forward that runs while the policy's activations wait for its backward (DPO's reference, KTO's reference and
    KL): each with all of those activations, and one layer's hidden states of the no-grad rows (`scale`: their
    rows per row with gradients)."""
    one = kept / n_layers * scale
    return [{**phases[name], kept_name: kept + one} for name in (EMBEDDING, FIRST_FORWARD, LAST_FORWARD)]
