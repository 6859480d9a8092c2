"""Save the adapter whole, from any FSDP configuration, so it loads with plain `PeftModel.from_pretrained`.

Trainer.save_model under FSDP2 with a FULL state dict hands PEFT tensors whose storage FSDP has freed
("Attempted to access the data pointer on an invalid python storage"), and PEFT's save of a sharded
model writes each rank's shard. Instead every rank joins the gather of the trainable (adapter)
parameters only, in the same order, and rank 0 writes them: the base weights are never gathered, so a
70B base does not land in one host's RAM at the end of the run.
"""

from __future__ import annotations

from pathlib import Path

from fsdp_tune.runfiles import ADAPTER_WEIGHTS
from fsdp_tune.worker.wrappers import canonical_name


def gather_trainable(model, also: frozenset[str] = frozenset()) -> dict:
    """Full CPU copies of the trainable parameters, and of the frozen ones named in `also` (canonical names):
    FSDP2 DTensors all-gathered; a collective on all ranks."""
    from torch.distributed.tensor import DTensor

    out: dict = {}
    done: dict[int, object] = {}  # a tied parameter is gathered once and saved under each of its names
    for name, param in model.named_parameters(remove_duplicate=False):
        if not param.requires_grad and canonical_name(name) not in also:
            continue
        if id(param) in done:
            out[canonical_name(name)] = done[id(param)].clone()  # safetensors stores no aliases
            continue
        tensor = param.detach()
        if isinstance(tensor, DTensor):
            mesh_device = tensor.device_mesh.device_type
            local = tensor.to_local()
            if local.device.type != mesh_device:  # CPU-offloaded shard, NCCL mesh: gather on the device
                local = local.to(mesh_device)
                tensor = DTensor.from_local(
                    local,
                    tensor.device_mesh,
                    tensor.placements,
                    run_check=False,
                    shape=tensor.shape,
                    stride=tensor.stride(),
                )
            tensor = tensor.full_tensor()
        out[canonical_name(name)] = done[id(param)] = tensor.to("cpu", copy=True).contiguous()
    return out


def adapter_key(name: str, keys: dict[str, str], adapter: str) -> str:
    """A parameter's key in adapter_model.safetensors: PEFT's (peft_keys), else saved_name's. The writer, the
    check and resume's reader name tensors through this one function."""
    return keys.get(canonical_name(name)) or saved_name(name, adapter)


def uses_fsdp1(model) -> bool:
    """FSDP1 wraps the model (or part of it): its flat parameters need torch's state-dict API."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1

    return any(isinstance(m, FSDP1) for m in model.modules())  # modules() includes the model itself


def saved_name(name: str, adapter: str) -> str:
    """The key PEFT's adapter file uses for a model parameter: no wrapper parts, no adapter name."""
    return canonical_name(name).replace(f".{adapter}.", ".")


def peft_keys(peft_model) -> dict[str, str]:
    """Canonical parameter name -> its key in adapter_model.safetensors, for every parameter PEFT's own save
    writes, trainable or not (LoRA and DoRA weights, expert LoRA, a modules_to_save copy, trainable tokens,
    trained biases), as PEFT's get_peft_model_state_dict names and selects them: the file then loads with
    PeftModel.from_pretrained whatever the options. PEFT selects and renames entries without reading them, so it
    is given each live parameter name (activation-checkpoint wrappers included, so its walk of the modules
    matches; tied ones under every name) as the entry itself."""
    from peft.utils import get_peft_model_state_dict

    names = {n: n for n, _ in peft_model.named_parameters(remove_duplicate=False)}
    adapter = peft_model.active_adapter
    chosen = get_peft_model_state_dict(peft_model, state_dict=names, adapter_name=adapter, save_embedding_layers=False)
    return {canonical_name(name): canonical_name(key) for key, name in chosen.items() if isinstance(name, str)}


def save_adapter(trainer, output_dir: str, final: str) -> Path | None:
    """Write adapter_model.safetensors + adapter_config.json to output_dir (rank 0); all ranks must call.
    final (RankSpec.save.final): "gather_trainable" (FSDP2: the trainable tensors all-gathered, nothing else) or
    "fsdp1_units" (FSDP1: unit by unit, saving/fsdp1_units.py)."""
    import torch.distributed as dist

    wrapped = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    is_peft = hasattr(peft_model, "peft_config")
    keys = peft_keys(peft_model) if is_peft else {}
    grew = trainer.saving.vocab_grew  # the trainer's typed saving options (training/trainer.py)
    keep = (resized_embedding_names(peft_model, grew) if is_peft else frozenset()) | frozenset(keys)
    if final == "fsdp1_units":
        from fsdp_tune.worker.saving.fsdp1_units import gather_adapter

        adapter = peft_model.active_adapter if is_peft else None
        state = gather_adapter(
            wrapped, lambda name, p: is_adapter(name, p.requires_grad, keep, adapter), canonical_name
        )
    else:
        state = gather_trainable(wrapped, also=keep)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    path = Path(output_dir)
    if rank0:
        if is_peft:
            write_peft_adapter(peft_model, state, path, keys)
        else:  # full fine-tuning: the model's own format
            peft_model.save_pretrained(output_dir, state_dict=state, is_main_process=True)
    if dist.is_initialized():
        dist.barrier()
    return path if rank0 else None


def is_adapter(name: str, trainable: bool, keep: frozenset[str], adapter: str | None) -> bool:
    """Whether a parameter (canonical name) belongs in the adapter file: trained, or kept (what PEFT saves, the
    resized embedding layers), or a LoRA tensor of the active adapter (FSDP1's flat parameters hide which are
    trained). Without an adapter (full fine-tuning) every trainable tensor."""
    if adapter is None:
        return trainable
    return trainable or name in keep or (f".{adapter}." in name and ".lora_" in name)


def adapter_subset(peft_model, state: dict, keep: frozenset[str]) -> dict:
    """From a whole model's state dict, the adapter's tensors and those in `keep` (what PEFT saves, the resized
    embedding layers): the base weights must not end up in the adapter file."""
    trainable = {canonical_name(n) for n, p in peft_model.named_parameters() if p.requires_grad}
    adapter = peft_model.active_adapter
    return {k: v for k, v in state.items() if is_adapter(k, k in trainable, keep, adapter)}


def resized_embedding_names(peft_model, grew: bool) -> frozenset[str]:
    """The input and output embedding weights, when the run added tokens to the vocabulary (`grew`: the model
    step says so, worker/loading/build.py Loaded.vocab_grew_from).

    Their new rows exist only in this run, so the adapter must carry both layers (as PEFT's own
    save_pretrained does when it sees the vocabulary changed), or it loads onto a resized base with
    different rows for the new tokens."""
    if not grew:
        return frozenset()
    base = peft_model.get_base_model()
    layers = {id(m) for m in (base.get_input_embeddings(), base.get_output_embeddings()) if m is not None}
    names = set()
    for name, module in peft_model.named_modules():
        if id(module) in layers:
            names.add(canonical_name(f"{name}.weight"))
    return frozenset(names)


def write_peft_adapter(peft_model, state: dict, output_dir: Path, keys: dict[str, str] | None = None) -> None:
    """adapter_model.safetensors + adapter_config.json in PEFT's layout: keys as peft_keys names them (others,
    the resized embeddings, with the adapter name dropped).

    Written directly rather than through PeftModel.save_pretrained(state_dict=...), which with FSDP's
    activation-checkpoint wrappers in the model filters every LoRA tensor out and writes an empty file.
    """
    import copy

    from safetensors.torch import save_file

    adapter = peft_model.active_adapter
    keys = keys or {}
    tensors = {adapter_key(k, keys, adapter): v for k, v in state.items()}
    config = copy.deepcopy(peft_model.peft_config[adapter])
    config.inference_mode = True
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = peft_model.base_model.model.name_or_path
    output_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(output_dir))
    save_file(tensors, str(output_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def load_adapter_into_fsdp(trainer, checkpoint_dir: str, resume: str) -> bool:
    """Load adapter_model.safetensors of a checkpoint into the sharded model (all ranks). False if absent.
    resume (RankSpec.save.resume): "local_rows" (FSDP2: each rank copies its rows into its shards where they live,
    GPU or pinned host memory; no collective) or "fsdp1_units" (saving/fsdp1_units.py). torch's
    set_model_state_dict is not used: under cpu_offload it finds the weights on the host and the buffers on the GPU
    and refuses ("Multiple devices found", torch 2.13 checkpoint/state_dict.py)."""
    from safetensors.torch import load_file

    path = Path(checkpoint_dir) / "adapter_model.safetensors"
    if not path.exists():
        return False
    saved = load_file(str(path), device="cpu")
    wrapped = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    adapter = peft_model.active_adapter
    keys = peft_keys(peft_model)

    def value_of(name: str):
        key = adapter_key(name, keys, adapter)
        if key not in saved:
            raise RuntimeError(f"{path} has no tensor {key}: it was written for another model or adapter")
        return saved[key]

    if resume == "fsdp1_units":
        from fsdp_tune.worker.saving.fsdp1_units import load_adapter

        keep = frozenset(keys) | resized_embedding_names(peft_model, trainer.saving.vocab_grew)
        load_adapter(
            wrapped, lambda name, p: is_adapter(name, p.requires_grad, keep, adapter), canonical_name, value_of
        )
        return True
    for name, param in wrapped.named_parameters():
        if param.requires_grad or canonical_name(name) in keys:
            copy_into_shard(param, value_of(name), name)
    return True


def copy_into_shard(param, full, name: str) -> None:
    """This rank's part of `full` (the whole tensor) into `param`'s local shard, on the device the shard lives on."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if tuple(full.shape) != tuple(param.shape):
        raise RuntimeError(f"{name}: the checkpoint holds {tuple(full.shape)}, the model has {tuple(param.shape)}")
    with torch.no_grad():
        if not isinstance(param, DTensor):
            param.copy_(full)
            return
        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        part = full[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
        param.to_local().copy_(part)
