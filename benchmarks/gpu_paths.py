"""The GPU decisions underneath fsdp-tune, checked with torch, transformers, PEFT and accelerate alone (no TRL,
datasets or bitsandbytes needed): what the GPU check can still run on a machine that lacks those.

Run by benchmarks/gpu_check.py on a GPU machine, one rank per GPU (torchrun). Each check is one decision of
decide/rank.py, exercised the way the ranks execute it:
- the process group "cuda:nccl,cpu:gloo" with cpu_offload: gradient clipping all-reduces CPU tensors;
- fsdp-tune's adapter gather (worker/saving/save.py) from CPU-offloaded FSDP2 shards on an NCCL mesh;
- a CPU mesh on a CUDA build (a CPU run on a GPU machine shards on the CPU, not on the GPUs);
- QLoRA's FSDP2 policy in the storage dtype keeps the packed 4-bit bytes intact (when bitsandbytes is there);
- sharded loading's 4-bit quantization (worker/sharded_4bit.py): each rank quantizes only the blocks under its
  shard of the packed weight on its own device, and gets bitsandbytes' whole-tensor bytes and quant state.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from benchmarks.gpu_proc import run_group

REPO = Path(__file__).resolve().parents[1]
# GPU_PATHS_DEVICE=cpu runs the same checks on CPU over gloo (offload off, no bitsandbytes check): a dry run of
# this script where no GPU is, so the GPU session spends its minutes on the GPU, not on this script's bugs
DEVICE = os.environ.get("GPU_PATHS_DEVICE", "cuda")


def run(timeout: float = 600) -> dict:
    """Launch the checks on every GPU; {"ok": bool, "checks": {name: "ok" | error}, "text": a report}."""
    import torch

    out = Path(tempfile.mkdtemp(prefix="fsdp-tune-gpu-paths-")) / "result.json"
    gpus = max(torch.cuda.device_count(), 1) if DEVICE == "cuda" else 2
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    cmd += ["-m", "benchmarks.gpu_paths", "--worker", str(out)]
    proc = run_group(cmd, dict(os.environ, GPU_PATHS_DEVICE=DEVICE), timeout)  # torchrun and its ranks
    if not out.exists():
        return {
            "ok": False,
            "checks": {},
            "text": f"gpu_paths: no result (exit {proc.returncode})\n{proc.stderr[-3000:]}",
        }
    checks = json.loads(out.read_text())
    lines = [f"GPU paths ({gpus} rank(s)):"] + [
        f"  {'ok    ' if v.startswith('ok') else ('skip  ' if v.startswith('skipped') else 'FAILED')} {k}: {v}"
        for k, v in checks.items()
    ]
    ok = bool(checks) and all(v.startswith(("ok", "skipped")) for v in checks.values())
    return {"ok": ok, "checks": checks, "text": "\n".join(lines)}


def _tiny_lora(device: str):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fsdp_tune.sources.builtin import PRESETS

    torch.manual_seed(0)
    config = LlamaConfig(**{**PRESETS["tiny-llama"], "num_hidden_layers": 2})  # the demo's shape, 2 layers
    model = LlamaForCausalLM(config).to(device)
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))


def _shard(model, mesh, offload: bool) -> None:
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kwargs = {"mesh": mesh, "offload_policy": CPUOffloadPolicy() if offload else None}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def check_offload_clip_and_gather(rank: int) -> str:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from fsdp_tune.worker.saving.save import gather_trainable

    model = _tiny_lora(DEVICE)
    _shard(model, init_device_mesh(DEVICE, (torch.distributed.get_world_size(),)), offload=DEVICE == "cuda")
    ids = torch.randint(0, 512, (2, 32), device=DEVICE)
    model(input_ids=ids, labels=ids).loss.backward()
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    state = gather_trainable(model)
    lora_a = [v for k, v in state.items() if "lora_A" in k]
    assert lora_a and all(v.shape[0] == 8 and v.device.type == "cpu" for v in lora_a), "gathered adapter is not whole"
    return f"ok (grad norm {float(norm):.3f}, {len(state)} trainable tensors gathered whole)"


def check_cpu_mesh_on_cuda_build() -> str:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    model = _tiny_lora("cpu")
    _shard(model, init_device_mesh("cpu", (torch.distributed.get_world_size(),)), offload=False)
    devices = {p.to_local().device.type for p in model.parameters()}
    ids = torch.randint(0, 512, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert devices == {"cpu"}, f"shards on {devices}"
    return "ok (every shard on the CPU)"


def check_qlora_storage_policy() -> str:
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None or DEVICE != "cuda":
        return "skipped: bitsandbytes is not installed" if DEVICE == "cuda" else "skipped: a GPU check"
    import bitsandbytes as bnb
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layer = bnb.nn.Linear4bit(256, 256, compute_dtype=torch.bfloat16, quant_storage=torch.float32).to("cuda")
    packed = layer.weight.data.clone()
    mesh = init_device_mesh("cuda", (torch.distributed.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, output_dtype=torch.float32)
    fully_shard(layer, mesh=mesh, mp_policy=policy)
    seen = {}
    layer.register_forward_pre_hook(lambda m, a: seen.setdefault("w", m.weight.data.clone()))
    layer(torch.randn(4, 256, device="cuda", dtype=torch.bfloat16))
    assert torch.equal(_bits(seen["w"]), _bits(packed)), "packed 4-bit weights changed in the all-gather"
    return "ok (packed bytes intact after the all-gather)"


def _bits(t):
    """Packed 4-bit data compared as bytes: in a float storage dtype some patterns are NaN, and NaN != NaN (torch
    2.11's bitsandbytes packing of the test weight holds one)."""
    import torch

    return t.contiguous().view(-1).view(torch.uint8)


def check_sharded_4bit() -> str:
    """A 200 x 72 weight (14400 values: at 2 and 3 ranks the shards split 64-value blocks) quantized per rank as
    sharded loading does, against bitsandbytes' quantize_4bit of the whole weight on the same device (nested)."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return "skipped: bitsandbytes is not installed"
    from types import SimpleNamespace

    import bitsandbytes.functional as bnbf
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    from fsdp_tune.worker.loading.four_bit import Packed, quant_state, quantize_shard, shard_ranges

    device = torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
    torch.manual_seed(0)
    weight = torch.randn(200, 72, dtype=torch.bfloat16)
    whole, state = bnbf.quantize_4bit(
        weight.to(device), blocksize=64, compress_statistics=True, quant_type="nf4", quant_storage=torch.float32
    )
    mesh = init_device_mesh(DEVICE, (torch.distributed.get_world_size(),))
    p = SimpleNamespace(placements=(Shard(0),), device_mesh=mesh, shape=whole.shape)
    ckpt = SimpleNamespace(rows=lambda key, start, stop: weight[start:stop])
    info = Packed((200, 72), 64, "nf4", True, torch.float32)
    local, absmax = quantize_shard(p, info, ckpt, "w", torch.bfloat16, device, device)
    ranges, _, me = shard_ranges(p)
    assert torch.equal(_bits(local), _bits(whole.view(-1)[ranges[me][0] : ranges[me][1]])), "packed bytes differ"
    mine = quant_state(absmax, info, torch.bfloat16)
    for name in ("absmax", "offset", "code"):
        assert torch.equal(getattr(mine, name), getattr(state, name)), f"quant_state.{name} differs"
    assert torch.equal(mine.state2.absmax, state.state2.absmax), "nested quant state differs"
    return f"ok (rank {me}'s {ranges[me][1] - ranges[me][0]} packed elements and the nested quant state as bnb's)"


def worker(out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    backend = "cuda:nccl,cpu:gloo" if DEVICE == "cuda" else "cpu:gloo"  # the spec's backend with cpu_offload
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    results = {}
    for name, fn in (
        (
            "cpu_offload under cuda:nccl,cpu:gloo: clip grad norm, gather the adapter",
            lambda: check_offload_clip_and_gather(rank),
        ),
        ("a CPU mesh on a CUDA build (a CPU run on a GPU machine)", check_cpu_mesh_on_cuda_build),
        ("QLoRA FSDP2 policy in the storage dtype", check_qlora_storage_policy),
        ("sharded loading: per-rank 4-bit quantization equals bitsandbytes'", check_sharded_4bit),
    ):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - a check that fails is the result
            results[name] = f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-3:]}"
        dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(results, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2])
