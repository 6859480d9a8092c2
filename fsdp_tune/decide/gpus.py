"""The GPUs fsdp-tune knows by name (`plan --gpu KEY`, `train --dry_run --gpu KEY`): their memory and public
figures. The planner's step time reads the figures; a simulated node (simulate.py) names its cards from here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense, public spec sheets
    link_gbs: float  # per-GPU collective bandwidth within a node (NVLink, or PCIe), GB/s
    host_gbs: float  # host <-> GPU copies (PCIe, one direction, pinned memory), GB/s: what cpu_offload pays


GPUS = {
    "h100": Gpu("H100 80GB SXM", 79.6, 989.0, 450.0, 50.0),  # PCIe Gen5 x16
    "h200": Gpu("H200 141GB SXM", 139.8, 989.0, 450.0, 50.0),
    "a100": Gpu("A100 80GB SXM", 79.2, 312.0, 300.0, 25.0),  # PCIe Gen4 x16
    "4090": Gpu("RTX 4090 24GB", 23.6, 165.0, 25.0, 25.0),
}
