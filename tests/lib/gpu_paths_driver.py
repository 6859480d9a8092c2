"""GPU paths run on a CPU build of torch, one scenario per process (tests/lib/test_gpu_paths_on_cpu.py).

A fake process group (torch's FakeStore, backend "fake") lets a DeviceMesh say "cuda" without CUDA: any code that
moves a tensor to the mesh's device then fails ("Torch not compiled with CUDA enabled"), which is exactly what must
not happen to an offloaded shard. `python -m tests.lib.gpu_paths_driver SCENARIO [RANK]` prints "ok" or raises.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn


def _fake_cuda_mesh(rank: int, world: int = 2):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    return DeviceMesh("cuda", torch.arange(world), _init_backend=False)


def _meta_param(mesh, shape: tuple[int, ...], requires_grad: bool = False) -> nn.Parameter:
    """A parameter as fully_shard leaves it on the meta device: a DTensor sharded on dim 0 over `mesh`."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    meta = torch.empty(shape, device="meta")
    spec = DTensorSpec(mesh, (Shard(0),), tensor_meta=TensorMeta(torch.Size(shape), meta.stride(), meta.dtype))
    local = torch.empty((shape[0] // mesh.size(), *shape[1:]), device="meta")
    return nn.Parameter(DTensor(local, spec, requires_grad=False), requires_grad=requires_grad)


def offloaded_shard_stays_on_host(rank: int) -> None:
    """Sharded loading under cpu_offload: the rank's rows, read into host memory, become the parameter's shard
    there; the parameter keeps its identity (FSDP2 holds it) and its global shape."""
    from fsdp_tune.worker.loading.units import swap_in

    p = _meta_param(_fake_cuda_mesh(rank), (8, 4))
    held = id(p)
    local = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    swap_in(p, local)
    assert id(p) == held and p.device_mesh.device_type == "cuda"
    assert p.to_local().device.type == "cpu" and p.to_local().data_ptr() == local.data_ptr()
    assert tuple(p.shape) == (8, 4) and not p.is_meta


def resume_copies_each_ranks_rows(rank: int) -> None:
    """Resume under cpu_offload: each rank copies its rows of the saved tensor into its shard in host memory,
    no collective and nothing moved to the mesh's device (torch's set_model_state_dict refuses such a model)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    from fsdp_tune.worker.saving.save import copy_into_shard

    mesh = _fake_cuda_mesh(rank)
    p = _meta_param(mesh, (6, 3), requires_grad=True)
    shard = torch.zeros(3, 3)
    spec = DTensorSpec(mesh, p.placements, tensor_meta=TensorMeta(p.shape, p.stride(), shard.dtype))
    torch.utils.swap_tensors(p, nn.Parameter(DTensor(shard, spec, requires_grad=False), requires_grad=True))
    full = torch.arange(18, dtype=torch.float32).reshape(6, 3)
    copy_into_shard(p, full, "lora_A")
    assert torch.equal(shard, full[3 * rank : 3 * rank + 3]) and shard.device.type == "cpu"
    try:
        copy_into_shard(p, torch.zeros(4, 3), "lora_A")
    except RuntimeError as err:
        assert "the checkpoint holds (4, 3), the model has (6, 3)" in str(err)
    else:
        raise AssertionError("a tensor of another shape was loaded")


def cpu_default_mesh(shim: bool) -> None:
    """A CPU run on a CUDA build of torch: torch._C._get_accelerator() says cuda (simulated here), so fully_shard
    without a mesh would build it on cuda. With the CPU shim it is the CPU."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29533"), RANK="0")
    os.environ["WORLD_SIZE"] = "1"
    dist.init_process_group("gloo")
    torch._C._get_accelerator = lambda: torch.device("cuda")
    if shim:
        from fsdp_tune.worker.cpu_fsdp import default_mesh_on_cpu

        default_mesh_on_cpu()
    from torch.distributed.fsdp import fully_shard

    layer = nn.Linear(4, 4)
    fully_shard(layer)
    assert layer.weight.device_mesh.device_type == "cpu"
    layer(torch.ones(2, 4)).sum().backward()


OFFLOAD_SCENARIOS = (offloaded_shard_stays_on_host, resume_copies_each_ranks_rows)

if __name__ == "__main__":
    name, arg = sys.argv[1], sys.argv[2]
    if name == "cpu_default_mesh":
        cpu_default_mesh(arg == "shim")
        print("ok")
    else:  # "offload RANK": every offload scenario as that rank, one fake group at a time
        for scenario in OFFLOAD_SCENARIOS:
            scenario(int(arg))
            dist.destroy_process_group()
            print(f"ok {scenario.__name__} rank {arg}")
