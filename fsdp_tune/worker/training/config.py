"""The trainer's config (SFTConfig for SFT) from the rank spec: its trainer_args exactly, the device mesh when
it has one, and FSDP2's QLoRA mixed-precision policy when the launcher decided one."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import ParallelismConfig
from accelerate.utils import TorchContextParallelConfig

from fsdp_tune.decide.spec import Mesh, RankSpec
from fsdp_tune.worker.training.spelling import installed_names


def trainer_config(spec: RankSpec, config_class: type, trainer_args: dict[str, Any]):
    """`config_class(**trainer_args)` (the spec's, or RankSpec.trainer_args_on's after a loading fallback)."""
    args = installed_names(dict(trainer_args), config_class)
    if spec.parallelism:
        args["parallelism_config"] = parallelism_config(spec.parallelism)
    config = config_class(**args)
    if spec.fsdp_mixed_precision:
        # the Trainer builds accelerate's FSDP plugin from these; a policy set here is kept (state.py sets the
        # run's precision only without override)
        policy = {k: getattr(torch, v) for k, v in spec.fsdp_mixed_precision.kwargs().items()}
        config.fsdp_plugin_args["mixed_precision_policy"] = policy
    return config


def parallelism_config(mesh: Mesh) -> ParallelismConfig:
    """accelerate's ParallelismConfig (the device mesh) from the spec's typed mesh, each field by name."""
    strategy = mesh.cp_comm_strategy
    return ParallelismConfig(
        dp_replicate_size=mesh.dp_replicate_size,
        dp_shard_size=mesh.dp_shard_size,
        tp_size=mesh.tp_size,
        cp_size=mesh.cp_size,
        cp_handler=TorchContextParallelConfig(cp_comm_strategy=strategy) if strategy is not None else None,
    )
