"""The policy's start and DPO/KTO's reference, on the PEFT model before FSDP shards it.

A starting adapter (--adapter, RankSpec.model.adapter) is loaded into the "default" adapter, whose shape the launcher
took from it (config/adapter_start.py).

The reference. DPOTrainer and KTOTrainer, given a PEFT model and no reference model, add an adapter "ref" and copy
every "default" weight into it (dpo_trainer.py:666-694, kto_trainer.py:717-745), then run each reference forward
with set_adapter("ref"). On a model FSDP2 has sharded already (sharded loading) the new adapter's weights would be
plain tensors beside DTensors and the copy fails ("aten.copy_.default got mixed torch.Tensor and DTensor"), and the
adapter would sit outside FSDP's units. So the sharded path adds "ref" itself, here, before fully_shard, with the
"default" adapter's config and dtypes, and makes that model's add_adapter("ref") a no-op: TRL's copy then runs
DTensor to DTensor inside the same units. The reference is therefore a frozen copy of the policy's start: the
starting adapter, or a fresh adapter (lora_B zero: exactly the base). `--reference base` with a starting adapter
zeroes the reference's lora_B once TRL has copied the start into it (reset_to_base): W + A·0 = W.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fsdp_tune.runfiles import ADAPTER_WEIGHTS

REF = "ref"  # the adapter name TRL's DPO and KTO trainers look for ("ref" in model.peft_config)


def add_reference_adapter(model) -> None:
    """Add the frozen "ref" adapter beside "default" (same config, same dtypes), RNG untouched, and make the
    model's add_adapter("ref") a no-op so TRL keeps this one. Call before fully_shard."""
    rng = torch.get_rng_state()
    model.add_adapter(REF, model.peft_config["default"])
    torch.set_rng_state(rng)  # the ref adapter's random init is overwritten by TRL's copy: draw nothing for it
    params = dict(model.named_parameters())
    for name, param in params.items():
        if f".{REF}." in name:
            twin = params.get(name.replace(f".{REF}.", ".default."))
            if twin is not None and param.dtype != twin.dtype:
                param.data = param.data.to(twin.dtype)
            param.requires_grad_(False)
    original = model.add_adapter

    def add_adapter(adapter_name, peft_config, *args, **kwargs):
        if adapter_name == REF and REF in model.peft_config:
            return None  # made before sharding: TRL copies "default" into it
        return original(adapter_name, peft_config, *args, **kwargs)

    model.add_adapter = add_adapter


def reset_to_base(model) -> int:
    """The reference adapter as the base: its lora_B zeroed (every rank its own shard). Returns how many."""
    from torch.distributed.tensor import DTensor

    zeroed = 0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if f".{REF}." in name and ".lora_B." in name:
                (param.to_local() if isinstance(param, DTensor) else param).zero_()
                zeroed += 1
    if not zeroed:
        raise RuntimeError("--reference base: the model has no reference adapter to reset")
    return zeroed


def load_start_adapter(model, folder: str) -> int:
    """The starting adapter's weights into the "default" adapter (real tensors: before sharding, or on the
    transformers path before the Trainer shards it). Every tensor of the file must land, and every LoRA weight of
    the model must be given one. Returns how many were loaded."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / ADAPTER_WEIGHTS))
    try:
        result = set_peft_model_state_dict(model, state, adapter_name="default")
    except RuntimeError as err:  # torch's "size mismatch for ...", one line per tensor
        lines = [line.strip() for line in str(err).splitlines() if "size mismatch" in line]
        raise RuntimeError(
            f"the starting adapter {folder} does not fit this model's LoRA: {len(lines)} tensor(s) differ in shape, "
            f"e.g. {lines[0] if lines else err}"
        ) from None
    unexpected = [k for k in result.unexpected_keys if ".default." in k or "lora_" in k]
    lora = {n for n, _ in model.named_parameters() if ".default." in n and "lora_" in n}
    missing = sorted(lora & set(result.missing_keys))
    if unexpected or missing:
        raise RuntimeError(
            f"the starting adapter {folder} does not fit this model's LoRA: "
            f"{len(unexpected)} tensor(s) of the file have no place (e.g. {unexpected[:1]}), "
            f"{len(missing)} LoRA weight(s) of the model get none (e.g. {missing[:1]})"
        )
    return len(state)
