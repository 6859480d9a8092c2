"""The planner's per-layer and loss terms against what the same model code allocates on this machine (CPU,
one process, tiny Llama shapes): what autograd saves for backward (saved-tensor hooks), and a step's peak
of live tensors (tests/lib/live_bytes.py). Nothing here is fitted: a term that disagrees is a wrong
reading of the code, and the fix goes into fsdp_tune/planner/terms.py with its reason. The terms scale
by shape (h, q, kv, i, r, tokens), which is what lets them plan a 70B model from these small ones."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from fsdp_tune.planner.shape import measure
from fsdp_tune.planner.stack import FULL_LOGIT_PATHS, Stack
from fsdp_tune.planner.terms import Adapters, checkpoint_kept, layer_saved
from tests.lib.live_bytes import LiveBytes

torch = pytest.importorskip("torch")

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SHAPES = {  # hidden, intermediate, heads, kv heads
    "gqa": (64, 176, 4, 2),
    "mha": (96, 256, 6, 6),
}


def _config(tmp_path, name: str, vocab: int = 256) -> tuple[dict, str]:
    h, i, heads, kv = SHAPES[name]
    data = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": h,
        "intermediate_size": i,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": 2,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
    }
    path = tmp_path / f"{name}-{vocab}.json"
    path.write_text(json.dumps(data))
    return data, str(path)


def _model(data: dict, dtype, adapters: Adapters):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**data, attn_implementation="sdpa")).to(dtype)
    if adapters.full:
        return model
    lora = LoraConfig(
        r=adapters.r, target_modules=sorted(adapters.targets), lora_dropout=adapters.dropout, use_dora=adapters.dora
    )
    model = get_peft_model(model, lora)
    for p in model.parameters():  # as FSDP's bf16 policy gathers them: adapters in the compute dtype
        p.data = p.data.to(dtype)
    return model


def _saved_by_one_layer(model, batch: int, seq: int, dtype) -> int:
    """Bytes of the tensors one decoder layer saves for backward, without parameters, the layer's input
    and the rotary tables every layer shares."""
    from torch.autograd.graph import saved_tensors_hooks

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layer = inner.model.layers[0]
    x = torch.randn(batch, seq, inner.config.hidden_size, dtype=dtype, requires_grad=True)
    pos = torch.arange(seq)[None].expand(batch, seq)
    cos, sin = inner.model.rotary_emb(x, pos)
    skip = {t.untyped_storage().data_ptr() for t in (x, cos, sin, *model.parameters())}
    seen: dict[int, int] = {}
    held = []  # a saved tensor freed early (DoRA's detached graph) must not lend its address to a later one

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen.setdefault(st.data_ptr(), st.nbytes())
            held.append(t)
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        layer(x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
    return sum(seen.values())


CASES = [
    # shape, dtype, batch, seq, adapters
    ("gqa", "float32", 2, 32, Adapters(frozenset(ALL), 8)),
    ("gqa", "bfloat16", 3, 40, Adapters(frozenset(ALL), 8)),
    ("gqa", "bfloat16", 3, 40, Adapters(frozenset(ALL), 16, dropout=0.1)),
    ("mha", "bfloat16", 1, 64, Adapters(frozenset({"q_proj", "v_proj"}), 4)),
    ("mha", "float32", 2, 24, Adapters(frozenset({"q_proj", "v_proj"}), 32, dropout=0.05)),
    ("gqa", "bfloat16", 2, 32, Adapters(full=True)),
    ("mha", "float32", 1, 80, Adapters(full=True)),
]


@pytest.mark.parametrize("name,dtype,batch,seq,adapters", CASES)
def test_layer_saved_matches_autograd(tmp_path, name, dtype, batch, seq, adapters) -> None:
    """Exactly what autograd saves, byte for byte: norms' fp32 copies, attention, MLP, LoRA's inputs."""
    data, path = _config(tmp_path, name)
    dt = getattr(torch, dtype)
    saved = _saved_by_one_layer(_model(data, dt, adapters), batch, seq, dt)
    st = Stack(compute_bytes=dt.itemsize, device="cpu")
    assert saved == layer_saved(measure(path), st, adapters, seq) * batch * seq


def test_dora_per_token_term(tmp_path) -> None:
    """DoRA also saves, per module, the base and the LoRA outputs of its magnitude multiply (2 x out per
    token). Its weight-norm pass saves weight-sized tensors in a graph it detaches (x_eye in^2, per forward,
    not per token): the difference of two sequence lengths isolates the per-token part."""
    data, path = _config(tmp_path, "mha")
    adapters = Adapters(frozenset(ALL), 8, dora=True)
    model = _model(data, torch.bfloat16, adapters)
    short, long = (_saved_by_one_layer(model, 2, seq, torch.bfloat16) for seq in (24, 56))
    st = Stack(compute_bytes=2, device="cpu")
    assert long - short == layer_saved(measure(path), st, adapters, 56) * 2 * (56 - 24)


@pytest.mark.parametrize("reentrant", [False, True, None])
def test_checkpointing_keeps_only_the_layer_input(tmp_path, reentrant) -> None:
    """What one decoder layer leaves alive after its forward, beyond its output: under activation
    checkpointing (reentrant or not) nothing but the input its caller holds (checkpoint_kept); without it,
    exactly what it saved for backward (layer_saved)."""
    data, path = _config(tmp_path, "gqa")
    adapters = Adapters(frozenset({"q_proj", "v_proj", "down_proj"}), 8)
    model = _model(data, torch.float32, adapters)
    if reentrant is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    inner = model.get_base_model().model
    x = torch.randn(2, 48, inner.config.hidden_size, requires_grad=True)
    pos = torch.arange(48)[None].expand(2, 48)
    cos, sin = inner.rotary_emb(x, pos)
    with LiveBytes(*model.parameters(), x, cos, sin, pos) as live:
        out = inner.layers[0](x, position_embeddings=(cos, sin), attention_mask=None, position_ids=pos)
    alive = live.now - out.untyped_storage().nbytes()
    shape, st = measure(path), Stack(compute_bytes=4, device="cpu")
    assert x.untyped_storage().nbytes() == checkpoint_kept(shape, st) * 2 * 48
    assert alive == (0 if reentrant is not None else layer_saved(shape, st, adapters, 48) * 2 * 48)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_full_logit_loss_bytes_per_logit(dtype) -> None:
    """transformers 5.24's ForCausalLMLoss as Trainer runs it (the output dropped before backward): the peak
    of the head, the loss and its backward, per logit, is what FULL_LOGIT_PATHS['hf_trainer'] says."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    dt = getattr(torch, dtype)
    tokens, h, vocab = 256, 16, 4096  # the logits dominate: T x V against T x h
    head = torch.nn.Linear(h, vocab, bias=False).to(dt).requires_grad_(False)
    hidden = torch.randn(1, tokens, h, dtype=dt, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with LiveBytes(head.weight, hidden, labels) as live:
        logits = head(hidden)
        loss = ForCausalLMLoss(logits, labels, vocab)
        forward = live.peak
        del logits
        loss.backward()
    fwd, bwd = FULL_LOGIT_PATHS["hf_trainer"]
    per_logit = tokens * vocab
    assert forward / per_logit == pytest.approx(fwd(dt.itemsize), rel=0.05)
    assert live.peak / per_logit == pytest.approx(max(fwd(dt.itemsize), bwd(dt.itemsize)), rel=0.05)


def test_terms_scale_with_shape(tmp_path) -> None:
    """The per-token terms are linear in the widths: doubling the batch doubles what a layer saves, and the
    same code at another shape is predicted by the same formula (checked above at two shapes)."""
    data, path = _config(tmp_path, "gqa")
    shape = measure(path)
    st, ad = Stack(compute_bytes=2), Adapters(frozenset(ALL), 8)
    wide = replace(shape, hidden_size=shape.hidden_size * 2, n_heads=shape.n_heads * 2, n_kv_heads=shape.n_kv_heads * 2)
    assert layer_saved(wide, st, ad, 32) > layer_saved(shape, st, ad, 32)
