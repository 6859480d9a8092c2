"""`fsdp-tune convert`: between the three formats through the typed config, and FSDP1 -> FSDP2."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from fsdp_tune.config.keys import STRATEGY_TO_RESHARD
from fsdp_tune.config.readers import ACCELERATE as ACCEL_IN
from fsdp_tune.config.readers import MANIFEST
from fsdp_tune.config.schema import SECTIONS, RunConfig
from fsdp_tune.config.writers import ACCELERATE, FORMATS, RECIPE, TRANSFORMERS, render, yaml_comments
from fsdp_tune.errors import ConfigError, Finding, Severity, UsageError
from fsdp_tune.validate import check

_DROPPED_IN_FSDP2 = {
    "backward_prefetch": "removed in FSDP2 (it always prefetches the next unit in backward)",
    "forward_prefetch": "not implemented in FSDP2 (accelerate refuses it, even false)",
    "sync_module_states": "removed in FSDP2 (rank 0 broadcasts when cpu_ram_efficient_loading is on)",
    "use_orig_params": "removed in FSDP2 (it always uses the original parameters)",
}


def migrate_to_fsdp2(cfg: RunConfig) -> tuple[RunConfig, list[str]]:
    """FSDP1 settings to FSDP2 (accelerate's to-fsdp2 table, plus HYBRID_SHARD as a mesh). Raises
    ConfigError when a strategy has no FSDP2 equivalent on this layout."""
    f = cfg.fsdp
    if f.version == 2:
        return cfg, ["already FSDP2: nothing to migrate"]
    notes: list[str] = []
    strategy = f.sharding_strategy or "FULL_SHARD"
    reshard = STRATEGY_TO_RESHARD[strategy]
    parallelism = cfg.parallelism
    if strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        parallelism = _hybrid_mesh(cfg, strategy)
        notes.append(
            f"sharding_strategy {strategy} -> a 2-D mesh: parallelism_config_dp_replicate_size="
            f"{parallelism.dp_replicate_size} (machines) x dp_shard_size={parallelism.dp_shard_size} (GPUs per "
            f"machine), reshard_after_forward={str(reshard).lower()}"
        )
    elif strategy == "NO_SHARD":
        raise _refusal(
            cfg, "CV002", "NO_SHARD is plain data parallelism; FSDP2 has no such mode", "use DDP, or FULL_SHARD"
        )
    else:
        notes.append(f"sharding_strategy {strategy} -> reshard_after_forward={str(reshard).lower()}")
    for key, why in _DROPPED_IN_FSDP2.items():
        if getattr(f, key) is not None:
            notes.append(f"dropped {key}: {why}")
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
    return replace(cfg, fsdp=new_fsdp, parallelism=parallelism), notes


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


def settings_diff(old: RunConfig, new: RunConfig) -> list[str]:
    lines = []
    for section in SECTIONS:
        a, b = getattr(old, section), getattr(new, section)
        for f in fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if x != y:
                lines.append(f"  {section}.{f.name}: {_show(x)} -> {_show(y)}")
    return lines


def _show(v) -> str:
    return ",".join(v) if isinstance(v, tuple) else str(v).lower() if isinstance(v, bool) else str(v)


def default_output(src: Path, fmt: str, fsdp2: bool) -> Path:
    suffix = ".json" if fmt == TRANSFORMERS else ".yaml"
    tag = {ACCELERATE: "accelerate", TRANSFORMERS: "fsdp_config", RECIPE: "recipe"}[fmt]
    return src.with_name(f"{src.stem}{'.fsdp2' if fsdp2 else ''}.{tag}{suffix}")


def convert(
    src: str, to: str | None, fsdp2: bool, output: str | None, force: bool
) -> tuple[Path, list[str], list[str]]:
    """Returns (written file, notes, settings diff). Refuses to overwrite without force."""
    checked = check(src, [])
    if checked.errors:
        raise ConfigError(src, checked.findings)
    cfg = checked.config
    fmt = to or _same_format(checked.format)
    if fmt not in FORMATS:
        raise UsageError(f"--to {fmt}: unknown format", f"one of: {', '.join(FORMATS)}")
    notes: list[str] = []
    new = cfg
    if fsdp2:
        new, notes = migrate_to_fsdp2(cfg)
    if fmt == TRANSFORMERS:
        lost = [
            s
            for s in ("launch", "model", "data", "lora", "quantization", "training")
            if s != "launch" and _has_settings(cfg, s)
        ]
        if lost or cfg.launch.num_processes != 1:
            notes.append(
                "a Transformers fsdp_config holds FSDP settings only: launch"
                + (f", {', '.join(lost)}" if lost else "")
                + " settings are not in the output "
                "(pass them as flags)"
            )
    out = Path(output) if output else default_output(Path(src), fmt, fsdp2)
    if out.exists() and not force:
        raise UsageError(f"{out} exists; not overwritten", "pass --force to replace it, or -o OTHER_FILE")
    text = Path(src).read_text()
    header, comments = yaml_comments(text) if not src.endswith(".json") else ([], {})
    if fmt == TRANSFORMERS:
        header, comments = [], {}
    if fmt != _same_format(checked.format):
        comments = {}  # key paths differ between formats; the header block still applies
    content = render(new, fmt, header=[h for h in header if "Run:" not in h], comments=comments)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(content)
    written = check(str(tmp), [])
    if written.errors:
        tmp.unlink()
        raise ConfigError(f"the converted {out}", written.findings)
    tmp.replace(out)
    return out, notes, settings_diff(cfg, new)


def _has_settings(cfg: RunConfig, section: str) -> bool:
    if section == "training":
        return bool(cfg.training.args)
    return any(p.startswith(section + ".") for p in cfg.origins)


def _same_format(read_as: str | None) -> str:
    """The format to write when --to is not given: the input's own; a run manifest becomes a recipe."""
    if read_as == ACCEL_IN:
        return ACCELERATE
    if read_as == MANIFEST:
        return RECIPE
    return read_as or RECIPE
