"""FSDP1 on CPU, one process over gloo (tests/lib/test_fsdp1_units_on_cpu.py): torch 2.13's FSDP1 wraps a model on
the CPU with `device_id=cpu` and NO_SHARD (one process has nothing to shard), the strategy fsdp-tune decides for one
GPU. A tiny PEFT Llama wrapped as accelerate wraps it (PEFT's fsdp_auto_wrap_policy, use_orig_params=False), then
`python -m tests.lib.fsdp1_driver` prints one JSON line of what it measured.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist


def _wrapped():
    from peft import LoraConfig, get_peft_model
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
    from torch.distributed.fsdp import ShardingStrategy
    from transformers import LlamaConfig, LlamaForCausalLM

    from fsdp_tune.sources.builtin import PRESETS

    torch.manual_seed(0)
    config = LlamaConfig(**{**PRESETS["tiny-llama"], "num_hidden_layers": 2})
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # LoRA starts B at zero: non-zero values show a copy is the parameter's own
            torch.nn.init.normal_(p)
    adapter = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    wrapped = FSDP1(
        model,
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.NO_SHARD,
        auto_wrap_policy=fsdp_auto_wrap_policy(model),
        use_orig_params=False,
    )
    ids = torch.randint(0, 512, (2, 16))
    wrapped(input_ids=ids, labels=ids).loss.backward()
    return wrapped, adapter


def main() -> dict:
    from accelerate.utils.fsdp_utils import _get_model_state_dict
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    from fsdp_tune.worker.saving.fsdp1_units import gather_adapter, load_adapter
    from fsdp_tune.worker.saving.save import is_adapter
    from fsdp_tune.worker.wrappers import canonical_name

    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("MASTER_PORT", "29563")
    dist.init_process_group("gloo")
    wrapped, adapter = _wrapped()
    wanted = lambda name, p: is_adapter(name, p.requires_grad, frozenset(), "default")  # noqa: E731
    got = gather_adapter(wrapped, wanted, canonical_name)
    same = sorted(got) == sorted(canonical_name(n) for n in adapter) and all(
        torch.equal(got[canonical_name(n)], v) for n, v in adapter.items()
    )
    # resume: every adapter tensor written back through its unit, then gathered again
    doubled = {k: v * 2 for k, v in got.items()}
    loaded = load_adapter(wrapped, wanted, canonical_name, lambda key: doubled[key])
    again = gather_adapter(wrapped, wanted, canonical_name)
    round_trip = all(torch.equal(again[k], doubled[k]) for k in doubled)
    # what accelerate's save_fsdp_model takes for a FULL_STATE_DICT checkpoint with adapter_only=True under FSDP1
    # (accelerate 1.15 utils/fsdp_utils.py): PEFT's get_peft_model_state_dict, which calls model.state_dict()
    taken: dict = {}
    whole = wrapped.state_dict

    def spy(*args, **kwargs):
        taken.update(whole(*args, **kwargs))
        return taken

    wrapped.state_dict = spy
    config = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)  # accelerate's, on one process
    with FSDP1.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT, config):
        kept = _get_model_state_dict(wrapped, adapter_only=True)
    params = {id(p) for p in wrapped.parameters()}
    mib = lambda d: sum(v.numel() * v.element_size() for v in d.values()) / 2**20  # noqa: E731
    dist.destroy_process_group()
    return {
        "units": sum(isinstance(m, FSDP1) for m in wrapped.modules()),
        "gathered": len(got),
        "adapter_tensors": len(adapter),
        "gathered_equals_adapter": same,
        "loaded": loaded,
        "round_trip": round_trip,
        "accelerate_state_dict_keys": len(taken),
        "accelerate_state_dict_mib": round(mib(taken), 3),
        "accelerate_kept_keys": len(kept),
        "adapter_mib": round(mib(got), 3),
        "whole_model_mib": round(sum(p.numel() * p.element_size() for p in wrapped.parameters()) / 2**20, 3),
        "accelerate_copies": sum(id(v) not in params for v in taken.values()),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
