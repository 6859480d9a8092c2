"""Worker-side pieces that need the HF stack but no processes: the CPU shim, the field table, verify."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.worker import cpu_fsdp


def _script(name: str):
    import importlib.util

    from tests.conftest import REPO

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_tables_match_installed_trl_and_peft() -> None:
    """The field tables the launcher reads without importing TRL/PEFT (built in this process: one import of each)."""
    training = _script("gen_training_fields")
    assert json.loads(training.OUT.read_text()) == training.build(), "stale: run scripts/gen_training_fields.py"
    lora = _script("gen_lora_fields")
    fields, model = lora.build()
    assert json.loads(lora.LORA_OUT.read_text()) == fields, "stale: run scripts/gen_lora_fields.py"
    assert json.loads(lora.MODEL_OUT.read_text()) == model, "stale: run scripts/gen_lora_fields.py"


def test_shim_turns_cpu_fsdp_plugin_into_fsdp_state(monkeypatch) -> None:
    """Without the shim accelerate keeps MULTI_CPU and drops the plugin; with it, FSDP2 is on."""
    import os

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    monkeypatch.setitem(os.environ, "ACCELERATE_USE_CPU", "true")
    for var, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "0",
    }.items():
        monkeypatch.setenv(var, value)
    original = AcceleratorState.__init__
    try:
        # Only the decision is under test: pretend the process group is up as a 2-rank CPU job.
        monkeypatch.setattr(PartialState, "__init__", _fake_partial_state)
        cpu_fsdp.install()
        assert cpu_fsdp.install() is True  # idempotent
        acc = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        assert acc.state.distributed_type == DistributedType.FSDP
        assert acc.state.fsdp_plugin.fsdp_version == 2
        # a later bare AcceleratorState() (accelerator.autocast(), AcceleratedOptimizer) keeps it FSDP
        assert AcceleratorState().distributed_type == DistributedType.FSDP == acc.distributed_type
    finally:
        AcceleratorState.__init__ = original
        AcceleratorState._reset_state(True)


def _fake_partial_state(self, cpu=False, **kwargs):
    import torch
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    self.__dict__ = PartialState._shared_state
    if not self.__dict__:
        self.__dict__.update(
            dict(
                _cpu=True,
                backend="gloo",
                device=torch.device("cpu"),
                distributed_type=DistributedType.MULTI_CPU,
                num_processes=2,
                process_index=0,
                local_process_index=0,
                fork_launched=False,
                debug=False,
            )
        )


def test_verify_rejects_a_shard_and_an_untrained_adapter(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    from fsdp_tune.worker.saving.verify import AdapterIntegrityError, verify_adapter

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4}))
    good = {"m.q.lora_A.weight": torch.randn(4, 16), "m.q.lora_B.weight": torch.randn(16, 4)}
    save_file(good, tmp_path / "adapter_model.safetensors")
    assert verify_adapter(str(tmp_path), {k: tuple(v.shape) for k, v in good.items()})["ok"]
    # one rank's half of lora_B rows (what a sharded save writes)
    save_file(
        {"m.q.lora_A.weight": torch.randn(4, 16), "m.q.lora_B.weight": torch.randn(8, 4)},
        tmp_path / "adapter_model.safetensors",
    )
    with pytest.raises(AdapterIntegrityError, match="the model has"):
        verify_adapter(str(tmp_path), {k: tuple(v.shape) for k, v in good.items()})
    save_file(
        {"m.q.lora_A.weight": torch.randn(2, 16), "m.q.lora_B.weight": torch.zeros(16, 4)},
        tmp_path / "adapter_model.safetensors",
    )
    with pytest.raises(AdapterIntegrityError, match="expected"):
        verify_adapter(str(tmp_path))
    save_file(
        {"m.q.lora_A.weight": torch.randn(4, 16), "m.q.lora_B.weight": torch.zeros(16, 4)},
        tmp_path / "adapter_model.safetensors",
    )
    with pytest.raises(AdapterIntegrityError, match="all zeros"):
        verify_adapter(str(tmp_path))


def test_verify_knows_expert_ranks_rank_patterns_and_lora_bias(tmp_path) -> None:
    """PEFT's ParamWrapper on fused experts: lora_A [r x E, in], lora_B [out, r x E]; rank_pattern's ranks;
    lora_B.bias [out]: all whole, so all pass; one rank's half of an expert pair does not."""
    import torch
    from safetensors.torch import save_file

    from fsdp_tune.worker.saving.verify import AdapterIntegrityError, verify_adapter

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "rank_pattern": {"q": 8}}))
    experts = "m.layers.0.mlp.experts"
    tensors = {
        f"{experts}.base_layer.lora_A.weight": torch.randn(2 * 4 * 4, 16),  # gate_up: 2r (fused) x 4 experts
        f"{experts}.base_layer.lora_B.weight": torch.randn(64, 2 * 4 * 4),
        f"{experts}.lora_A.weight": torch.randn(4 * 4, 32),  # down: r x 4 experts
        f"{experts}.lora_B.weight": torch.randn(16, 4 * 4),
        "m.q.lora_A.weight": torch.randn(8, 16),  # rank_pattern: 8
        "m.q.lora_B.weight": torch.randn(16, 8),
        "m.q.lora_B.bias": torch.randn(16),
    }
    save_file(tensors, tmp_path / "adapter_model.safetensors")
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    ranks = {f"{experts}.base_layer": 32, experts: 16, "m.q": 8}
    assert verify_adapter(str(tmp_path), shapes, ranks)["ok"]
    assert verify_adapter(str(tmp_path))["ok"]  # from the file alone: multiples of r (or the pattern's rank)
    half = dict(tensors, **{f"{experts}.lora_A.weight": torch.randn(8, 32)})  # one rank's rows of the pair
    save_file(half, tmp_path / "adapter_model.safetensors")
    with pytest.raises(AdapterIntegrityError, match="the model has"):
        verify_adapter(str(tmp_path), shapes, ranks)
    with pytest.raises(AdapterIntegrityError, match="one rank dimension"):
        verify_adapter(str(tmp_path))


def test_truncated_rows_counts_what_trl_cut() -> None:
    """TRL truncates silently: rows (no packing) or sequences inside packed rows (BFD) at max_length."""
    from datasets import Dataset

    from fsdp_tune.worker.data.lengths import truncated_rows

    rows = Dataset.from_dict({"input_ids": [[1] * 8, [1] * 3, [1] * 8, [1] * 5]})
    assert truncated_rows(rows, 8, packing=False) == (2, 4)
    packed = Dataset.from_dict({"input_ids": [[1] * 8, [1] * 8], "seq_lengths": [[8], [3, 5]]})
    assert truncated_rows(packed, 8, packing=True) == (1, 3)
    assert truncated_rows(Dataset.from_dict({"text": ["a"]}), 8, packing=False) == (0, 0)


def test_fsdp1_full_state_is_cut_down_to_the_adapter() -> None:
    """FSDP1's final save gathers the whole model's state; only the adapter (and resized embeddings) is written."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fsdp_tune.worker.saving.save import adapter_subset, resized_embedding_names, saved_name

    base = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
    )
    model = get_peft_model(base, LoraConfig(r=4, target_modules="all-linear"))
    state = model.state_dict()
    lora = {k for k in state if ".lora_" in k}
    assert set(adapter_subset(model, state, frozenset())) == lora
    assert resized_embedding_names(model, grew=False) == frozenset()
    grown = resized_embedding_names(model, grew=True)
    assert grown == {"base_model.model.model.embed_tokens.weight", "base_model.model.lm_head.weight"}
    assert set(adapter_subset(model, state, grown)) == lora | grown
    assert {saved_name(k, "default") for k in lora} == {k.replace(".default.", ".") for k in lora}


def test_truncated_rows_sees_the_rows_trl_kept() -> None:
    """After TRL's filter and shuffle (an indices mapping over the Arrow table), only the kept rows count."""
    from datasets import Dataset

    from fsdp_tune.worker.data.lengths import truncated_rows

    rows = Dataset.from_dict({"input_ids": [[1] * 8, [1] * 3, [1] * 8, [1] * 5]})
    kept = rows.filter(lambda r: len(r["input_ids"]) != 3).shuffle(seed=0)
    assert truncated_rows(kept, 8, packing=False) == (2, 3)
