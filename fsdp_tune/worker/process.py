"""The rank's process before any model: its environment (the spec's, as the launcher exported it), its log,
the CPU shims when the spec asks (FSDP's, and context parallelism's attention), the test-only Hub stand-in, the
Hub client's filter, and the process group."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker import cpu_cp, cpu_fsdp, faults
from fsdp_tune.worker.logs import setup_rank_log
from fsdp_tune.worker.rank import local_rank, rank, restart_count, world_size
from fsdp_tune.worker.saving import hub


def start(spec: RankSpec) -> None:
    """Rank log, environment, the CPU shim (when the spec asks), test hooks, the Hub client, process group."""
    os.environ.update(spec.env)  # inherited from the launcher already; a spec run by hand gets it too
    setup_rank_log(spec.output_dir, rank(), spec.console)
    print(f"fsdp-tune: rank {rank()}/{world_size()} starting on {socket.gethostname()} (pid {os.getpid()})", flush=True)
    if spec.cpu_fsdp_shim:
        cpu_fsdp.install()
        if spec.parallelism is not None and spec.parallelism.cp_size > 1:
            cpu_cp.install()  # SDPA's CPU kernel under context parallelism: torch's ring attention (cpu_cp.py)
    faults.install_fake_hub()  # test-only; nothing unless FSDP_TUNE_TEST_FAKE_HUB is set
    hub.exclude_bookkeeping()
    init_process_group(spec)


def init_process_group(spec: RankSpec) -> None:
    """Join the process group under a key prefix of its own per torchrun attempt.

    With torchrun's agent-hosted store, an elastic restart finds the previous attempt's gloo/NCCL
    addresses still in the store, and the new ranks try to connect to dead peers ("Gloo connectFullMesh
    failed ... Connection refused"). accelerate/Trainer then find the group initialised and use it.
    """
    if dist.is_initialized():
        return
    store, global_rank, world = next(dist.rendezvous("env://"))
    if spec.device == "cuda":
        torch.cuda.set_device(local_rank())
    dist.init_process_group(
        spec.backend,
        store=dist.PrefixStore(f"fsdp_tune/attempt{restart_count()}", store),
        rank=global_rank,
        world_size=world,
        timeout=timedelta(seconds=spec.timeout_s),
    )
