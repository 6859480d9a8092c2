"""`fsdp-tune env`: what a bug report needs. Imports torch (it is the point), but only for this command."""

from __future__ import annotations

import importlib.util
import os
import platform

from fsdp_tune.decide.machine import ram_gib
from fsdp_tune.sources.versions import tested, versions


def collect() -> dict:
    found = versions()
    info: dict = {"versions": found, "platform": platform.platform(), "cpu_count": os.cpu_count()}
    # each library against the versions fsdp-tune is tested with (sources/versions.py): the pre-flight warns (PF029)
    info["tested"] = tested(found)
    total = ram_gib("MemTotal")
    info["ram_gib"] = None if total is None else round(total, 1)
    info["flash_attn_installed"] = importlib.util.find_spec("flash_attn") is not None
    try:
        import torch

        info["cuda_available"] = torch.cuda.is_available()
        info["cuda_version"] = torch.version.cuda
        info["nccl_available"] = torch.distributed.is_nccl_available()
        info["gloo_available"] = torch.distributed.is_gloo_available()
        info["gpus"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                "bf16": torch.cuda.is_bf16_supported(),
            }
            for i in range(torch.cuda.device_count())
        ]
    except ImportError:
        info["cuda_available"] = None
    try:
        import bitsandbytes as bnb  # noqa: F401

        info["bitsandbytes_backend"] = "cuda" if info.get("cuda_available") else "cpu"
    except Exception as e:  # noqa: BLE001 - a broken bnb install is exactly what this should report
        info["bitsandbytes_backend"] = f"unavailable ({type(e).__name__}: {e})"
    return info
