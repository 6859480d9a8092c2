"""FSDP1 settings as FSDP2 settings: the one mapping `convert --fsdp2` writes and a config without `fsdp_version`
runs.

accelerate's launcher reads an Accelerate YAML without `fsdp_version` as FSDP1; transformers' own default is FSDP2
and it deprecates FSDP1. fsdp-tune runs such a config as FSDP2 (FSDP1 loads the whole model on every GPU before it
wraps it: the PEFT guide's 70B QLoRA on 2 x 24 GB cannot fit that way), with its FSDP1 keys mapped exactly as
`convert --fsdp2` maps them, and says so in one note; `fsdp_version: 1` written out keeps FSDP1. A config whose
FSDP1 strategy has no FSDP2 equivalent on its layout (NO_SHARD; HYBRID_SHARD on one machine) stays FSDP1, warned.
"""

from __future__ import annotations

from dataclasses import replace

from fsdp_tune.config.keys import STRATEGY_TO_RESHARD
from fsdp_tune.config.schema import Origin, RunConfig
from fsdp_tune.errors import ConfigError, Finding, Severity

# What an Accelerate YAML without fsdp_version says in its origin (config/readers.py), and once run as FSDP2.
ACCELERATE_DEFAULT = "absent, accelerate's default"
ADOPTED = "absent: FSDP2 (accelerate launch would run FSDP1)"
ADOPTED_NOTE = "no fsdp_version: FSDP2; `accelerate launch` would run FSDP1; `fsdp_version: 1` keeps it"

DROPPED_IN_FSDP2 = {
    "backward_prefetch": "removed in FSDP2 (it always prefetches the next unit in backward)",
    "forward_prefetch": "not implemented in FSDP2 (accelerate refuses it, even false)",
    "sync_module_states": "removed in FSDP2 (rank 0 broadcasts when cpu_ram_efficient_loading is on)",
    "use_orig_params": "removed in FSDP2 (it always uses the original parameters)",
}


def migrate_to_fsdp2(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """FSDP1 settings to FSDP2 (accelerate's to-fsdp2 table, plus HYBRID_SHARD as a mesh). Raises
    ConfigError when a strategy has no FSDP2 equivalent on this layout. Origins follow the values: the new
    reshard_after_forward (and a hybrid mesh) point at the sharding_strategy line; dropped keys have none."""
    f = cfg.fsdp
    if f.version == 2:
        return cfg, ["already FSDP2: nothing to migrate"]
    notes: list[str] = []
    strategy = f.sharding_strategy or "FULL_SHARD"
    reshard = STRATEGY_TO_RESHARD[strategy]
    parallelism = cfg.parallelism
    origins = dict(cfg.origins)
    strategy_origin = origins.pop("fsdp.sharding_strategy", None)
    if strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        parallelism = _hybrid_mesh(cfg, strategy)
        notes.append(
            f"sharding_strategy {strategy} -> a 2-D mesh: parallelism_config_dp_replicate_size="
            f"{parallelism.dp_replicate_size} (machines) x dp_shard_size={parallelism.dp_shard_size} (GPUs per "
            f"machine), reshard_after_forward={str(reshard).lower()}"
        )
        if strategy_origin:
            for name in ("enabled", "dp_replicate_size", "dp_shard_size"):
                origins[f"parallelism.{name}"] = strategy_origin
    elif strategy == "NO_SHARD":
        raise _refusal(
            cfg, "CV002", "NO_SHARD is plain data parallelism; FSDP2 has no such mode", "use DDP, or FULL_SHARD"
        )
    else:
        notes.append(f"sharding_strategy {strategy} -> reshard_after_forward={str(reshard).lower()}")
    if strategy_origin and "fsdp.reshard_after_forward" not in origins:
        origins["fsdp.reshard_after_forward"] = strategy_origin
    for key, why in DROPPED_IN_FSDP2.items():
        if getattr(f, key) is not None:
            notes.append(f"dropped {key}: {why}")
        origins.pop(f"fsdp.{key}", None)
    if f.state_dict_type == "LOCAL_STATE_DICT":
        notes.append("state_dict_type LOCAL_STATE_DICT -> SHARDED_STATE_DICT (FSDP2 has no local state dict)")
    new_fsdp = replace(
        f,
        version=2,
        reshard_after_forward=reshard,
        sharding_strategy=None,
        backward_prefetch=None,
        forward_prefetch=None,
        sync_module_states=None,
        use_orig_params=None,
        state_dict_type="SHARDED_STATE_DICT" if f.state_dict_type == "LOCAL_STATE_DICT" else f.state_dict_type,
    )
    notes.append("fsdp_version 1 -> 2")
    return replace(cfg, fsdp=new_fsdp, parallelism=parallelism, origins=origins), notes


def implicit_fsdp1(cfg: RunConfig) -> bool:
    """An Accelerate YAML that does not say which FSDP (accelerate launch would run FSDP1), and no flag saying it."""
    origin = cfg.origin("fsdp.version")
    return cfg.fsdp.version == 1 and origin is not None and origin.source.endswith(ACCELERATE_DEFAULT)


def adopt_fsdp2(cfg: RunConfig) -> tuple[RunConfig, list[Finding]]:
    """A config without fsdp_version runs FSDP2, mapped as `convert --fsdp2` maps it; one finding says so (a
    warning, with the reason, when its strategy keeps it on FSDP1)."""
    if not implicit_fsdp1(cfg) or cfg.launch.distributed_type.upper() != "FSDP":
        return cfg, []
    origin = cfg.origin("fsdp.version")
    try:
        new, notes = migrate_to_fsdp2(cfg)
    except ConfigError:
        return cfg, []  # FSDP1 kept: rule FT022 says why (kept_reason)
    dropped = [n.split(":")[0].removeprefix("dropped ") for n in notes if n.startswith("dropped ")]
    mapped = [n for n in notes if not n.startswith("dropped ") and n != "fsdp_version 1 -> 2"]
    if dropped:
        mapped.append(f"{', '.join(dropped)} dropped (FSDP2 has no such setting)")
    source = origin.source.replace(ACCELERATE_DEFAULT, ADOPTED)
    new = replace(new, origins={**new.origins, "fsdp.version": Origin("fsdp_version", source)})
    detail = f" (as `convert --fsdp2` maps it: {'; '.join(mapped)})" if mapped else ""
    return new, [
        Finding(
            "FT022",
            Severity.NOTE,
            "fsdp_version",
            origin.source,
            f"{ADOPTED_NOTE}{detail}",
            "",
        )
    ]


def kept_reason(cfg: RunConfig) -> str | None:
    """Why a config without fsdp_version stays FSDP1 (its strategy has no FSDP2 equivalent here), or None."""
    if not implicit_fsdp1(cfg):
        return None
    try:
        migrate_to_fsdp2(cfg)
    except ConfigError as refused:
        return refused.findings[0].message
    return None


def version_note(cfg: RunConfig) -> str | None:
    """The one line `plan` and the launch plan print for a config that runs FSDP2 without saying so."""
    origin = cfg.origin("fsdp.version")
    return ADOPTED_NOTE if origin is not None and origin.source.endswith(ADOPTED) else None


def _hybrid_mesh(cfg: RunConfig, strategy: str):
    """HYBRID_SHARD shards within a machine and replicates across machines: FSDP2 spells it as a 2-D mesh."""
    lc = cfg.launch
    if lc.num_machines < 2:
        raise _refusal(
            cfg,
            "CV001",
            f"{strategy} shards within a machine and replicates across machines, but this config has one machine: "
            "there is nothing to replicate across",
            "use FULL_SHARD on one machine, or set num_machines to the node count before converting",
        )
    return replace(cfg.parallelism, enabled=True, dp_replicate_size=lc.num_machines, dp_shard_size=lc.nproc_per_node)


def _refusal(cfg: RunConfig, rule: str, message: str, hint: str) -> ConfigError:
    where = cfg.where("fsdp.sharding_strategy")
    return ConfigError(
        cfg.config_path or "config", [Finding(rule, Severity.ERROR, "fsdp_sharding_strategy", where, message, hint)]
    )
