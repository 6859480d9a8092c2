"""Sharded loading (the rank spec's loading.path "sharded"): the model is built on the meta device, LoRA is
applied, the FSDP2 units are made, and then every rank reads only its own shard of each parameter from the
safetensors files, layer by layer, quantizing only what it keeps under QLoRA. At any moment a rank holds its
shards plus one tensor in flight, where from_pretrained holds the whole model on every rank.

The result equals the transformers path (from_pretrained, get_peft_model in SFTTrainer, accelerate's
fully_shard) bit for bit: the same config through from_config under init_empty_weights (buffers such as rotary
inv_freq computed as usual), LoRA's initial values drawn from the same RNG in the same order, accelerate 1.15's
units and policies (the rank spec's loading.sharded says which: decided on the launcher, decide/loading.py), and
4-bit bytes and quant states as bitsandbytes makes them (four_bit.py). The Trainer then gets an FSDP2 model,
which accelerate leaves as it is (fsdp2_prepare_model returns an FSDPModule untouched), with NO_WRAP and FSDP
activation checkpointing off in its fsdp_config, and no peft_config.

A model this path cannot build raises FallbackRequired before any collective, on every rank alike: the rank says
why and loads it with from_pretrained, with the fsdp_config the launcher decided for that path (unless the run
asked for sharded loading by name: then it stops and says why). That choice is the model step's (build.py).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from accelerate import init_empty_weights
from peft import get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from transformers import AutoConfig, GenerationConfig, set_seed
from transformers.quantizers import AutoHfQuantizer

from fsdp_tune.config.model_kinds import KINDS
from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.loading import units
from fsdp_tune.worker.loading.adapter import lora_config
from fsdp_tune.worker.loading.files import Checkpoint, FallbackRequired, checkpoint_key, model_folder, renamed_keys
from fsdp_tune.worker.loading.files import rank_fallback_reason as _config_reason
from fsdp_tune.worker.loading.four_bit import pack_meta_weights
from fsdp_tune.worker.loading.pretrained import quantization_config
from fsdp_tune.worker.loading.reference import add_reference_adapter, load_start_adapter


@dataclass
class ShardedModel:
    model: Any  # the PEFT model, fully_shard-ed
    vocab_grew_from: int | None  # the checkpoint's vocabulary, when the chat template's tokens grew it
    stats: dict[str, Any]  # what the load report records about this path


@dataclass
class MetaModel:
    """The model on the meta device, and what filling it needs."""

    model: Any
    quantizer: Any  # transformers' bitsandbytes quantizer, or None
    packed: dict = field(default_factory=dict)  # {id(Linear4bit): Packed}
    new_rows: dict = field(default_factory=dict)  # {id(embedding module): the rows a vocabulary resize drew}
    vocab_grew_from: int | None = None


def build_sharded_model(spec: RankSpec, tokenizer, args) -> ShardedModel:
    """The PEFT model, fully_shard-ed, every parameter a DTensor whose local shard this rank read itself.
    Collective (QLoRA's absmax): every rank calls it."""
    m, plan = spec.model, spec.loading.sharded
    t0 = time.time()
    ckpt = Checkpoint(model_folder(m.name_or_path))
    meta = _meta_model(spec, ckpt, len(tokenizer))
    ckpt.names = renamed_keys(meta.model, ckpt)  # transformers' own renames (a vision-language checkpoint's keys)
    model = _with_lora(meta.model, spec, meta.quantizer is not None, plan.upcast_trainable, spec.seed)
    prefix = "base_model.model." if spec.lora is not None else ""
    _check_keys(model, ckpt, prefix, meta.packed, meta.new_rows)
    classes = units.layer_classes(model, plan.layer_cls or getattr(model, "_no_split_modules", None) or [])
    if plan.activation_checkpointing:
        units.apply_ac(model, classes, plan.activation_checkpointing_offload)
    t1 = time.time()
    units.apply_fsdp2(model, classes, **_fsdp_kwargs(spec, args))
    t2 = time.time()
    loaded, quantized = units.fill(model, ckpt, prefix, meta.packed, meta.new_rows, _devices(spec), _dtype(m.dtype))
    stats = dict(
        seconds={"meta_build": round(t1 - t0, 2), "fully_shard": round(t2 - t1, 2), "fill": round(time.time() - t2, 2)},
        tensors_read=loaded,
        tensors_quantized=quantized,
        checkpoint_mib=round(sum((ckpt.dir / f).stat().st_size for f in set(ckpt.weight_map.values())) / 2**20, 1),
    )
    return ShardedModel(model, meta.vocab_grew_from, stats)


def _meta_model(spec: RankSpec, ckpt: Checkpoint, vocab: int) -> MetaModel:
    """The model from its config with every parameter on the meta device (buffers real), as from_pretrained
    configures it: tied, named, its generation config, 4-bit modules in place, the vocabulary grown for new
    tokens."""
    m = spec.model
    config = AutoConfig.from_pretrained(str(ckpt.dir), trust_remote_code=m.trust_remote_code)
    reason = _config_reason(config, m.trust_remote_code)
    if reason:
        raise FallbackRequired(reason)
    dtype = _dtype(m.dtype)
    rng = torch.get_rng_state()
    with init_empty_weights(include_buffers=False):
        model = getattr(transformers, KINDS[m.kind].auto_class).from_config(
            config, dtype=dtype, attn_implementation=m.attn_implementation, trust_remote_code=m.trust_remote_code
        )
    torch.set_rng_state(rng)  # the meta build draws nothing today; LoRA's draws must stay where they are
    model.tie_weights()  # from_pretrained ties after loading; from_config under init_empty_weights does not
    model.name_or_path = model.config._name_or_path = m.name_or_path
    kept = getattr(model, "_keep_in_fp32_modules", None) or getattr(model, "_keep_in_fp32_modules_strict", None)
    if kept and dtype != torch.float32:
        raise FallbackRequired(f"from_pretrained keeps {', '.join(kept)} in float32 under {m.dtype}")
    with contextlib.suppress(OSError, ValueError):
        model.generation_config = GenerationConfig.from_pretrained(str(ckpt.dir))
    quantizer, packed = _quantize_meta(model, spec)
    old = model.get_input_embeddings().weight.shape[0]
    new_rows = _grow_vocab(model, vocab)
    model.config.use_cache = False
    model.eval()  # as from_pretrained returns it; the Trainer switches to train()
    if quantizer is not None:  # is_loaded_in_4bit, config.quantization_config: what PEFT, TRL and Trainer read
        quantizer.postprocess_model(model)
        model.hf_quantizer = quantizer
    return MetaModel(model, quantizer, packed, new_rows, old if vocab > old else None)


def _quantize_meta(model, spec: RankSpec):
    """transformers' own bitsandbytes quantizer swaps in Linear4bit (skipping what it skips: the output head),
    then each 4-bit weight becomes a meta parameter of its packed shape."""
    if not spec.model.quantization:
        return None, {}
    quantizer = AutoHfQuantizer.from_config(quantization_config(spec), pre_quantized=False)
    quantizer.preprocess_model(model, device_map={"": "cpu"}, dtype=_dtype(spec.model.dtype))
    return quantizer, pack_meta_weights(model)


def _grow_vocab(model, vocab: int) -> dict:
    """Grow the embeddings for tokens the chat template added, as load_model does (pad to a multiple of 8, plain
    init): the embedding modules are materialised on CPU for the resize, so the new rows are the same random
    numbers; only those rows are kept ({id(module): rows}) and the modules go back to the meta device."""
    old = model.get_input_embeddings().weight.shape[0]
    if vocab <= old:
        return {}

    def modules() -> dict:
        both = (model.get_input_embeddings(), model.get_output_embeddings())
        return {id(e): e for e in both if e is not None}

    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    for module in modules().values():
        module.to_empty(device="cpu")
    if tied:
        model.tie_weights()
    model.resize_token_embeddings(vocab, pad_to_multiple_of=8, mean_resizing=False)
    rows = {}
    for key, module in modules().items():
        rows[key] = module.weight.detach()[old:].clone()
        module.to("meta")
    if tied:
        model.tie_weights()
    return rows


@contextlib.contextmanager
def _adapters_stay_real():
    """PEFT moves each new adapter to the device of its base layer (LoraModel._replace_module,
    BaseTunerLayer._move_adapter_to_device_of_base_layer): on a meta base that drops its initial values. While
    get_peft_model runs, moves to the meta device become moves to the CPU (dtype casts still apply)."""
    original_move, original_to = BaseTunerLayer._move_adapter_to_device_of_base_layer, nn.Module.to

    def move(self, adapter_name, device=None):
        weight = getattr(self.get_base_layer(), "weight", None)
        if device is None and weight is not None and weight.device.type == "meta":
            device = torch.device("cpu")
        return original_move(self, adapter_name, device)

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta":
            return self if dtype is None else original_to(self, dtype=dtype, non_blocking=non_blocking)
        return original_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer, nn.Module.to = move, to
    try:
        yield
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer, nn.Module.to = original_move, original_to


def _with_lora(model, spec: RankSpec, quantized: bool, upcast: bool, seed: int):
    """get_peft_model as SFTTrainer runs it (right after its set_seed(args.seed): a vocabulary resize before it
    draws from the same RNG), with the dtype changes that follow it on the transformers path: SFTTrainer's bf16
    adapters for a quantized model, accelerate's fp32 upcast of trainable parameters under mixed precision
    (fsdp2_prepare_model; not with 4-bit weights). A starting adapter's weights go into it; DPO and KTO get their
    reference adapter beside it (worker/loading/reference.py)."""
    if spec.lora is None:
        return model
    set_seed(seed)
    with _adapters_stay_real():
        model = get_peft_model(model, lora_config(spec))
        if spec.model.adapter:  # the policy starts from a trained adapter (--adapter)
            load_start_adapter(model, spec.model.adapter)
        for name, p in model.named_parameters():
            if quantized and p.requires_grad and "lora_magnitude_vector" not in name:
                p.data = p.data.to(torch.bfloat16)
            elif upcast and p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.to(torch.float32)
        if spec.method.reference_adapter:  # DPO/KTO's (GRPO's from --adapter) frozen "ref" adapter, inside the units
            add_reference_adapter(model)
    return model


def _check_keys(model, ckpt: Checkpoint, prefix: str, packed: dict, new_rows: dict) -> None:
    """Every meta parameter has its tensor in the checkpoint, of the shape the model expects: checked before any
    sharding or collective, so a model that needs the transformers path fails here, whole, on all ranks alike."""
    for name, p in model.named_parameters():
        if not p.is_meta:
            continue
        key = checkpoint_key(name, prefix)
        if key not in ckpt:
            raise FallbackRequired(f"{name}: no tensor {key!r} in the checkpoint (renamed or converted keys?)")
        owner = id(model.get_submodule(name.rpartition(".")[0]))
        want = packed[owner].shape if owner in packed and name.endswith(".weight") else tuple(p.shape)
        have = ckpt.shape(key)
        if tuple(have) != tuple(want) and not (owner in new_rows and tuple(have[1:]) == tuple(want[1:])):
            raise FallbackRequired(f"{key}: the checkpoint holds {tuple(have)}, the model expects {tuple(want)}")


def _fsdp_kwargs(spec: RankSpec, args) -> dict:
    """fully_shard's arguments as accelerate would pass them: the plugin's policies and the mesh's FSDP dims."""
    plan = spec.loading.sharded
    policy = {k: _dtype(v) for k, v in (plan.mp_policy.kwargs() if plan.mp_policy else {}).items()}
    mesh = None
    pc = args.parallelism_config
    if pc is not None:  # the same DeviceMesh object the Trainer's Accelerator then uses (cached on the config)
        mesh = pc.get_device_mesh(spec.device)[tuple(pc.fsdp_dim_names)]
    return {
        "reshard_after_forward": plan.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy() if plan.cpu_offload else OffloadPolicy(),
        "mp_policy": MixedPrecisionPolicy(**policy),
        "mesh": mesh,
    }


def _devices(spec: RankSpec):
    """(where 4-bit weights are quantized and collectives run, where the shards live): the rank's GPU, and the
    host under cpu_offload (FSDP2 pins the shards there)."""
    device = torch.device("cuda", torch.cuda.current_device()) if spec.device == "cuda" else torch.device("cpu")
    return device, torch.device("cpu") if spec.loading.sharded.cpu_offload else device


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)
