"""Parameter counts of a model without its weights: built on PyTorch's meta device from its config.

Exact for any architecture transformers knows (no formulas per family). torch/transformers are imported
only here, inside `measure`, so `plan` pays for them only when it needs a shape.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fsdp_tune.sources.model import find_config


@dataclass(frozen=True)
class Linear:
    name: str  # e.g. "self_attn.q_proj"
    in_features: int
    out_features: int


@dataclass(frozen=True)
class ModelShape:
    source: str
    total_params: int
    embedding_params: int  # input embeddings
    head_params: int  # lm_head (0 when tied to the embeddings)
    layer_params: int  # one decoder layer
    n_layers: int
    other_params: int  # final norm and the like
    layer_linears: tuple[Linear, ...]  # the Linear modules of one decoder layer
    layer_class: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    n_heads: int
    n_kv_heads: int

    @property
    def linear_params(self) -> int:
        """Parameters of all decoder-layer Linear weights (what 4-bit quantization packs)."""
        return self.n_layers * sum(lin.in_features * lin.out_features for lin in self.layer_linears)

    def as_dict(self) -> dict:
        return asdict(self)


def measure(name: str) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source, data = find_config(name)
    config = AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    layers = _decoder_layers(model)
    layer = layers[0]
    linears = tuple(
        Linear(n, m.in_features, m.out_features) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)
    )
    total = sum(p.numel() for p in model.parameters())
    n_embed = embed.weight.numel()
    n_head = 0 if tied or head is None else head.weight.numel()
    n_layer = sum(p.numel() for p in layer.parameters())
    return ModelShape(
        source=source,
        total_params=total,
        embedding_params=n_embed,
        head_params=n_head,
        layer_params=n_layer,
        n_layers=len(layers),
        other_params=total - n_embed - n_head - n_layer * len(layers),
        layer_linears=linears,
        layer_class=type(layer).__name__,
        hidden_size=config.hidden_size,
        intermediate_size=getattr(config, "intermediate_size", 4 * config.hidden_size),
        vocab_size=config.vocab_size,
        n_heads=config.num_attention_heads,
        n_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
    )


def _decoder_layers(model) -> list:
    """The repeated blocks FSDP wraps: the model's _no_split_modules, or else the longest ModuleList of one
    class (models that declare no _no_split_modules). UsageError when the model has neither."""
    import torch

    from fsdp_tune.errors import UsageError

    declared = set(model._no_split_modules or [])
    layers = [m for m in model.modules() if type(m).__name__ in declared]
    if layers:
        return layers
    stacks = [
        list(m)
        for m in model.modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1
    ]
    if not stacks:
        raise UsageError(
            f"{type(model).__name__} declares no _no_split_modules and has no stack of repeated layers: the planner "
            "cannot tell what FSDP would wrap",
            "name the layer class with --fsdp_transformer_layer_cls_to_wrap, or plan a model with decoder layers",
        )
    return max(stacks, key=len)
