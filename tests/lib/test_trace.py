"""`plan --trace` on small models (real code, fake tensors, a fake process group of 4 ranks): the CLI's result, the
extrapolation against a trace of every layer, the FLOPs and collective bytes against closed forms of the executed
ops, the CUDA stand-ins, QLoRA's quant state and CPU offload. Each trace takes a few seconds."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.validate import check
from tests.conftest import REPO

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.lib

FSDP2 = str(REPO / "configs" / "fsdp2.json")
DIMS = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}
VOCAB, LAYERS, R = 4096, 6, 8


@pytest.fixture(scope="module")
def model_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trace") / "config.json"
    data = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB}
    path.write_text(json.dumps({**data, **DIMS, "num_hidden_layers": LAYERS, "tie_word_embeddings": False}))
    return str(path)


def _cfg(model: str, *flags: str):
    base = ["--model_name_or_path", model, "--num_processes", "4", "--bf16", "True", "--use_peft_lora", "True"]
    base += ["--lora_r", str(R), "--lora_target_modules", "all-linear", "--per_device_train_batch_size", "2"]
    return check(FSDP2, [*base, "--max_seq_len", "256", *flags]).config


def test_plan_trace_json_gives_the_traced_peak_and_its_categories(model_config) -> None:
    args = ["plan", FSDP2, "--model_name_or_path", model_config, "--use_peft_lora", "True", "--bf16", "True"]
    r = CliRunner().invoke(app, [*args, "--num_processes", "4", "--max_seq_len", "256", "--trace", "--json"])
    assert r.exit_code == 0, r.output
    trace = json.loads(r.stdout)["trace"]
    assert trace["peak_allocated_gib"] > 0 and trace["layers_traced"] == [3, 4] and trace["extrapolated"]
    assert {"sharded parameters", "activations (forward and recompute)"} <= set(trace["categories_gib"])
    assert trace["peak_phase"] in trace["phases_gib"] and trace["world_size"] == 4
    assert trace["comparison"]["trace_peak_allocated_gib"] == trace["peak_allocated_gib"]


def test_a_library_it_was_not_checked_against_stops_plan_trace_with_exit_2(model_config, monkeypatch) -> None:
    from fsdp_tune.trace import guard

    monkeypatch.setitem(guard.CHECKED, "torch", ((2, 12), (2, 12)))
    args = ["plan", FSDP2, "--model_name_or_path", model_config, "--use_peft_lora", "True", "--trace"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "TR001" in r.output and "checked against torch 2.12" in r.output, r.output


def test_every_extrapolated_phase_equals_the_trace_of_every_layer(model_config) -> None:
    from fsdp_tune.trace.run import trace

    cfg = _cfg(model_config)
    extrapolated, full = trace(cfg, (3, 4)), trace(cfg, (LAYERS,))
    assert full["layers_traced"] == [LAYERS] and not full["extrapolated"]
    assert extrapolated["phases_gib"].keys() == full["phases_gib"].keys()
    for phase, gib in full["phases_gib"].items():
        assert extrapolated["phases_gib"][phase] == pytest.approx(gib, rel=0.005, abs=0.002), phase
    assert extrapolated["flops_per_step"] == pytest.approx(full["flops_per_step"], rel=0.005)
    gathered = full["comm_bytes_per_step"]["all-gather"]
    assert extrapolated["comm_bytes_per_step"]["all-gather"] == pytest.approx(gathered, rel=0.005)


def test_flops_and_all_gather_bytes_are_those_of_the_executed_ops(model_config) -> None:
    """Closed forms of what one step runs: each base linear forward, recomputed, and backward for its input (6 T N),
    but layer 0's q, k and v need no input gradient (their input comes from the frozen embedding); each LoRA pair
    forward, recomputed, backward for input and weight (8 T r (in + out)); TRL's head over the shifted tokens:
    forward, the backward's recomputed tile and the hidden states' gradient (6 T V h); SDPA as torch counts it (18 B
    H S^2 D a layer with the recompute). All-gathers: every layer twice (forward, backward), the embedding twice
    (forward, the prefetch at layer 0's backward), lm_head's weight once (TRL's full_tensor), 3/4 of each received."""
    from fsdp_tune.planner.shape import measure
    from fsdp_tune.trace.run import trace

    shape = measure(model_config)
    b, s, h = 2, 256, DIMS["hidden_size"]
    t, heads = b * s, DIMS["num_attention_heads"]
    linear = sum(lin.in_features * lin.out_features for lin in shape.layer_linears)
    lora = sum(R * (lin.in_features + lin.out_features) for lin in shape.layer_linears)
    attention = 18 * b * heads * s * s * (h // heads)
    head = 6 * b * (s - 1) * VOCAB * h
    qkv = [lin for lin in shape.layer_linears if lin.name.split(".")[-1] in ("q_proj", "k_proj", "v_proj")]
    no_input_grad = sum(2 * t * lin.in_features * (lin.out_features + R) for lin in qkv)
    flops = LAYERS * (6 * t * linear + 8 * t * lora + attention) + head - no_input_grad
    traced = trace(_cfg(model_config, "--lora_dropout", "0"), (3, 4))
    assert traced["flops_per_step"] == pytest.approx(flops, rel=0.01)
    layer_bytes = 2 * (shape.layer_params + lora)
    gathered = (2 * LAYERS * layer_bytes + 2 * 2 * VOCAB * h) * 3 / 4 + 2 * VOCAB * h * 3 / 4
    assert traced["comm_bytes_per_step"]["all-gather"] == pytest.approx(gathered, rel=0.01)


def test_qlora_counts_the_replicated_quant_state_and_offload_leaves_shards_on_the_host() -> None:
    """A 7B shape (sizes cost nothing in fake mode; three and four of its layers are traced)."""
    from fsdp_tune.planner.shape import measure
    from fsdp_tune.planner.weights import quant_constant_bytes
    from fsdp_tune.trace.run import trace

    quant = ["--use_4bit_quantization", "True", "--use_nested_quant", "True"]
    quant += ["--bnb_4bit_compute_dtype", "bfloat16", "--bnb_4bit_quant_storage_dtype", "bfloat16"]
    cfg = _cfg("meta-llama/Llama-2-7b-hf", *quant)
    on_device = trace(cfg)
    constants = quant_constant_bytes(cfg, measure("meta-llama/Llama-2-7b-hf")) / 2**30
    buffers = on_device["categories_gib"]["buffers (4-bit quant state, rotary tables)"]
    assert buffers == pytest.approx(constants, rel=0.02)
    offloaded = trace(_cfg("meta-llama/Llama-2-7b-hf", *quant, "--fsdp_offload_params", "true"))
    host = sum(on_device["categories_gib"].get(k, 0) for k in ("sharded parameters", "optimizer state"))
    assert offloaded["peak_allocated_gib"] == pytest.approx(on_device["peak_allocated_gib"] - host, abs=0.01)


def test_the_cuda_stand_ins_allocate_what_the_cuda_paths_do() -> None:
    """Dropout saves a bool mask; TRL's fused head holds no fp32 copy of its logit tile; bitsandbytes' 4-bit matmul
    dequantizes its weight past 1536 tokens and allocates only the output below."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.autograd.graph import saved_tensors_hooks

    from fsdp_tune.trace.standins import _gemm_4bit, cuda_paths
    from tests.lib.live_bytes import LiveBytes

    saved = []
    with FakeTensorMode(), cuda_paths(), saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
        torch.nn.functional.dropout(torch.empty(8, 16, requires_grad=True), 0.1, True)
    assert [x.dtype for x in saved] == [torch.bool]

    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    def head_peak(stand_ins: bool) -> int:
        with FakeTensorMode(), LiveBytes() as live, cuda_paths() if stand_ins else _nothing():
            hidden = torch.empty(512, 64, dtype=torch.bfloat16, requires_grad=True)
            weight = torch.empty(4096, 64, dtype=torch.bfloat16)
            out = ChunkedLogProbFunction.apply(hidden, weight, None, torch.zeros(512, dtype=torch.long), 1.0, 4096)
            out[0].sum().backward()
        return live.peak

    tile = 512 * 4096
    assert head_peak(False) - head_peak(True) >= 4 * tile * 4  # the CPU path's fp32 copies of the tile
    with FakeTensorMode():
        a, packed, absmax = torch.empty(2048, 256, dtype=torch.bfloat16), torch.empty(256 * 128, 1), torch.empty(2048)
        with LiveBytes() as many:
            _gemm_4bit(a, packed, (512, 256), absmax, 64, "nf4")
        a = a[:1024]
        with LiveBytes() as few:
            _gemm_4bit(a, packed, (512, 256), absmax, 64, "nf4")
    assert many.peak >= 512 * 256 * 2 + 2048 * 512 * 2  # the dequantized weight and the output
    assert few.peak == 1024 * 512 * 2  # the output alone


def _nothing():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("batch", [("2", "512"), ("1", "128")])
def test_a_tied_model_traces_and_the_plan_holds_its_embedding_gathered(tmp_path, batch) -> None:
    """The tied [norm, embedding, head] unit is gathered from the embedding's forward to the end of backward (its
    lm_head member never runs a forward under TRL's fused head: the tracker once failed on it)."""
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.trace.run import trace

    data = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32768, "hidden_size": 1024}
    data.update(intermediate_size=2816, num_attention_heads=8, num_key_value_heads=4, num_hidden_layers=6)
    (tmp_path / "config.json").write_text(json.dumps({**data, "tie_word_embeddings": True}))
    args = ["--model_name_or_path", str(tmp_path / "config.json"), "--num_processes", "4", "--bf16", "True"]
    args += ["--use_peft_lora", "True", "--per_device_train_batch_size", batch[0], "--max_seq_len", batch[1]]
    cfg = check(FSDP2, args).config
    traced, planned = trace(cfg), memory_plan(cfg)["training_peak_gib"]
    assert planned == pytest.approx(traced["peak_allocated_gib"], rel=0.05)


def test_layers_that_differ_are_all_traced_rather_than_extrapolated(tmp_path) -> None:
    """Qwen2-MoE with a dense first layer (mlp_only_layers): no straight line runs through 3 and 4 such layers."""
    from fsdp_tune.trace.run import trace

    data = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "vocab_size": 4096, **DIMS}
    data.update(moe_intermediate_size=128, shared_expert_intermediate_size=256, num_experts=4, num_experts_per_tok=2)
    data.update(num_hidden_layers=LAYERS, mlp_only_layers=[0], tie_word_embeddings=False)
    (tmp_path / "config.json").write_text(json.dumps(data))
    cfg = _cfg(str(tmp_path / "config.json"), "--fsdp_transformer_layer_cls_to_wrap", "Qwen2MoeDecoderLayer")
    traced = trace(cfg)
    assert traced["layers_traced"] == [LAYERS] and not traced["extrapolated"]
    notes = " ".join(traced["notes"])
    assert "differ in size" in notes and "mixture of experts" in notes


def test_a_build_not_sharded_as_the_run_is_an_error_not_a_peak(model_config, monkeypatch) -> None:
    """check_sharding reads what was built (the group's size, every unit's FSDP mesh, a layer's shard) against the
    run; trace_at reports no peak for a build sharded otherwise (it would be another run's) and builds it once."""
    from dataclasses import replace

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from fsdp_tune.trace import build as builder
    from fsdp_tune.trace import run

    cfg = _cfg(model_config)
    spec = run.rank_spec(cfg)
    dist.init_process_group("fake", rank=0, world_size=4, store=FakeStore())
    try:
        built = builder.build(spec, cfg, 3)
        assert builder.check_sharding(built, 4) is None
        assert "shards over 4 ranks x 1 replicas, the run's 8 x 1" in builder.check_sharding(
            replace(built, mesh=replace(built.mesh, dp_shard_size=8)), 4
        )
        assert "the fake process group has 4 ranks, the run 8" in builder.check_sharding(built, 8)
    finally:
        dist.destroy_process_group()

    checked = []
    monkeypatch.setattr(builder, "check_sharding", lambda b, w: checked.append(w) or "unit x shards over 2 ranks")
    with pytest.raises(RuntimeError, match="built 3 layers sharded unlike the run: unit x shards over 2 ranks"):
        run.trace_at(spec, cfg, 3)
    assert checked == [4] and not dist.is_initialized()
