"""Parameter counts of a model without its weights: built on PyTorch's meta device from its config.

Exact for any architecture transformers knows (no formulas per family). torch/transformers are imported
only here, inside `measure`, so `plan` pays for them only when it needs a shape.

Mixture-of-experts layers: transformers 5 fuses a layer's experts into 3-D parameters (Mixtral's
`experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I]), which are no nn.Linear; they are
counted in `expert_params` (part of `layer_params`) and a token runs `top_k` of the `n_experts`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from functools import cache

from fsdp_tune.config.model_kinds import KINDS, family_of, kind_of
from fsdp_tune.sources.model import ModelFacts, model_facts


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
    layer_params: int  # one decoder layer (its experts included)
    n_layers: int
    other_params: int  # final norm and the like
    layer_linears: tuple[Linear, ...]  # the Linear modules of one decoder layer
    layer_class: str
    hidden_size: int
    intermediate_size: int  # of the dense MLP, or of one expert
    vocab_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int = 0  # 0: hidden_size // n_heads
    n_norms: int = 2  # normalisation modules per decoder layer (Gemma-2 has four)
    expert_params: int = 0  # fused (3-D) expert parameters of one layer
    expert_tensors: tuple[tuple[str, int], ...] = ()  # (leaf name, values) of each: gate_up_proj, down_proj
    n_experts: int = 0
    top_k: int = 0  # experts a token runs through
    tied_head: bool = False
    # a vision-language model's vision tower and projector (config/model_kinds.py); 0 for a language model
    vision_params: int = 0  # the tower and the projector (in other_params' place: units of their own)
    vision_layers: int = 0  # the tower's blocks (an FSDP unit each)
    vision_layer_params: int = 0
    vision_hidden: int = 0  # the tower's width
    vision_mlp: int = 0  # its MLP's
    # the model's files and config.json as decided (decide/derived.py Derived.model, the rank spec's ModelSpec.facts):
    # what the planner's terms read of the model beyond its shape (LoRA's reach on experts, the image processor)
    facts: ModelFacts = field(default_factory=lambda: ModelFacts("absent"), compare=False, repr=False)

    @property
    def linear_params(self) -> int:
        """Parameters of all decoder-layer Linear weights (what bitsandbytes 4-bit quantization packs; fused
        3-D experts are no nn.Linear and stay in the storage dtype)."""
        return self.n_layers * sum(lin.in_features * lin.out_features for lin in self.layer_linears)

    @property
    def q_dim(self) -> int:
        return self.n_heads * (self.head_dim or self.hidden_size // self.n_heads)

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * (self.head_dim or self.hidden_size // self.n_heads)

    @property
    def mlp_width(self) -> int:
        """Intermediate activations a token makes in one layer's MLP: top_k experts' worth under MoE."""
        return self.intermediate_size * (self.top_k if self.n_experts else 1)

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: all but the experts it is not routed to."""
        if not self.n_experts:
            return self.total_params
        idle = self.expert_params * (self.n_experts - self.top_k) // self.n_experts
        return self.total_params - self.n_layers * idle

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("facts")
        return out


def measure(model: ModelFacts | str, name: str = "") -> ModelShape:
    """The shape of the model whose facts were decided (`model`; `name`: as the user wrote it, for the source
    line), or of a model named here (a str: found through the model door: benchmarks and tests)."""
    facts = model_facts(model) if isinstance(model, str) else model
    name = name or (model if isinstance(model, str) else facts.path or "")
    if facts.config is None:
        raise FileNotFoundError(name)
    shape = _measured(facts.describe(name), json.dumps(facts.config, sort_keys=True))
    return replace(shape, facts=facts)


@cache
def _measured(source: str, config_json: str) -> ModelShape:
    """Long because it reads every fact of the shape from one meta-device build, in one place."""
    import torch
    import transformers
    from transformers import AutoConfig

    data = json.loads(config_json)
    config = AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = getattr(transformers, KINDS[kind_of(data)].auto_class).from_config(config)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    row = family_of(data)
    vision = _vision(model, row)
    layers = _decoder_layers(model, row.language if row else None)
    layer = layers[0]
    linears = tuple(
        Linear(n, m.in_features, m.out_features) for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)
    )
    total = sum(p.numel() for p in model.parameters())
    n_embed = embed.weight.numel()
    n_head = 0 if tied or head is None else head.weight.numel()
    n_layer = sum(p.numel() for p in layer.parameters())
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_experts = getattr(text, "num_local_experts", None) or getattr(text, "num_experts", None) or 0
    experts = sum(p.numel() for p in layer.parameters() if p.dim() == 3) if n_experts else 0
    return ModelShape(
        source=source,
        total_params=total,
        embedding_params=n_embed,
        head_params=n_head,
        layer_params=n_layer,
        n_layers=len(layers),
        other_params=total - n_embed - n_head - n_layer * len(layers) - vision.get("vision_params", 0),
        layer_linears=linears,
        layer_class=type(layer).__name__,
        hidden_size=text.hidden_size,
        intermediate_size=getattr(text, "moe_intermediate_size", None)
        or getattr(text, "intermediate_size", 4 * text.hidden_size),
        vocab_size=text.vocab_size,
        n_heads=text.num_attention_heads,
        n_kv_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads,
        n_norms=sum(1 for m in layer.modules() if "norm" in type(m).__name__.lower()),
        expert_params=experts,
        expert_tensors=tuple((n.rsplit(".", 1)[-1], p.numel()) for n, p in layer.named_parameters() if p.dim() == 3)
        if n_experts
        else (),
        n_experts=n_experts if experts else 0,
        top_k=(getattr(text, "num_experts_per_tok", None) or 0) if experts else 0,
        tied_head=tied,
        **vision,
    )


def _vision(model, row) -> dict:
    """A vision-language model's tower and projector, counted (ModelShape's vision_* fields)."""
    if row is None:
        return {}
    tower, projector = model.get_submodule(row.tower), model.get_submodule(row.projector)
    params = {id(p): p.numel() for m in (tower, projector) for p in m.parameters()}
    blocks = [m for m in tower.modules() if type(m).__name__ in _block_names(row)]
    c = tower.config
    width = getattr(c, "embed_dim", None) or getattr(c, "hidden_size", 0)  # Qwen2-VL: embed_dim
    mlp = getattr(c, "intermediate_size", None) or int(getattr(c, "mlp_ratio", 4) * width)
    return {
        "vision_params": sum(params.values()),
        "vision_layers": len(blocks),
        "vision_layer_params": sum(p.numel() for p in blocks[0].parameters()) if blocks else 0,
        "vision_hidden": int(width or 0),
        "vision_mlp": int(mlp or 0),
    }


def _block_names(row) -> set[str]:
    return {row.tower_layers} if isinstance(row.tower_layers, str) else set(row.tower_layers.values())


def _decoder_layers(model, language: str | None = None) -> list:
    """The repeated blocks FSDP wraps: the model's _no_split_modules, or else the longest ModuleList of one
    class (models that declare no _no_split_modules); a vision-language model's under its language model (path
    `language`). UsageError when the model has neither."""
    import torch

    from fsdp_tune.errors import UsageError

    if language is not None:
        model = model.get_submodule(language)
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
