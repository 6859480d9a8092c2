"""FSDP settings: versions, wrap policies, state dict types, FSDP1 leftovers, activation checkpointing."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.fsdp2 import kept_reason
from fsdp_tune.config.keys import FSDP1_ONLY, STRATEGY_TO_RESHARD
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.derived import Derived, fsdp1_unsharded
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rules.registry import error, finding, rule, warning


@rule("FT020", "fsdp", "FSDP distributed_type: fsdp-tune launches FSDP only")
def distributed_type(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.launch.distributed_type.upper() != "FSDP":
        yield error(
            cfg,
            "FT020",
            "launch.distributed_type",
            f"distributed_type is {cfg.launch.distributed_type!r}: fsdp-tune launches FSDP runs only",
            "set `distributed_type: FSDP` with `fsdp_config: {fsdp_version: 2}`",
        )


@rule("FT021", "fsdp", "fsdp version must be 1 or 2")
def version(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.fsdp.version not in (1, 2):
        yield error(
            cfg,
            "FT021",
            "fsdp.version",
            f"fsdp version {cfg.fsdp.version} does not exist (accelerate would launch it and treat it as neither)",
            "use `fsdp_version: 2`",
        )


@rule("FT022", "fsdp", "FSDP1 is deprecated; on CPU (asked for, or a machine without GPUs) it cannot run", decided=True)
def fsdp1(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if cfg.fsdp.version != 1 or cfg.launch.distributed_type.upper() != "FSDP":
        return  # not an FSDP config at all: FT020 says so, and its fix names FSDP2
    if d.on_cpu:
        where = "" if d.machine_has_gpus else " (this machine has no GPU)"
        yield error(
            cfg,
            "FT022",
            "fsdp.version",
            f"FSDP1 does not run on CPU{where}: only FSDP2's fully_shard supports the gloo backend",
            f"fsdp-tune convert --fsdp2 {cfg.config_path or 'CONFIG'}  (or set `fsdp_version: 2`)",
        )
    elif kept_reason(cfg):  # no fsdp_version, and a strategy FSDP2 cannot express (config/fsdp2.py)
        yield warning(
            cfg,
            "FT022",
            "fsdp.version",
            f"no fsdp_version: FSDP1 kept, as `accelerate launch` runs it ({kept_reason(cfg)}); FSDP1 is "
            "deprecated in transformers (removal announced for v5.20) and does not run on CPU",
            "write `fsdp_version: 1` to say so, or change the strategy and use FSDP2",
        )
    else:
        yield warning(
            cfg,
            "FT022",
            "fsdp.version",
            "this config means FSDP1, which transformers deprecates (removal announced for v5.20)",
            f"fsdp-tune convert --fsdp2 {cfg.config_path or 'CONFIG'}",
        )


@rule("FT023", "fsdp", "FSDP1-only keys under FSDP2 are dropped")
def fsdp1_only_keys(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.fsdp.version != 2:
        return
    for path, why in FSDP1_ONLY.items():
        if not cfg.is_set(path):
            continue
        if path == "fsdp.sharding_strategy":
            strategy = cfg.fsdp.sharding_strategy
            if strategy in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "NO_SHARD"):
                yield error(
                    cfg,
                    "FT023",
                    path,
                    f"sharding_strategy {strategy} has no FSDP2 equivalent without a device mesh",
                    "use parallelism_config_dp_replicate_size/dp_shard_size for hybrid sharding, or `fsdp_version: 1`",
                )
            elif not cfg.is_set("fsdp.reshard_after_forward"):
                yield warning(
                    cfg,
                    "FT023",
                    path,
                    f"sharding_strategy is an FSDP1 key; read as reshard_after_forward="
                    f"{str(STRATEGY_TO_RESHARD[strategy]).lower()}",
                    f"write `reshard_after_forward: {str(STRATEGY_TO_RESHARD[strategy]).lower()}`",
                )
            else:
                yield warning(
                    cfg,
                    "FT023",
                    path,
                    "sharding_strategy is ignored under FSDP2; reshard_after_forward decides",
                    "remove it",
                )
            continue
        yield warning(cfg, "FT023", path, f"ignored under FSDP2 and dropped: {why}", "remove it")


@rule("FT024", "fsdp", "LOCAL_STATE_DICT is FSDP1-only")
def local_state_dict(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.fsdp.version == 2 and cfg.fsdp.state_dict_type == "LOCAL_STATE_DICT":
        yield error(
            cfg,
            "FT024",
            "fsdp.state_dict_type",
            "FSDP2 does not support LOCAL_STATE_DICT",
            "use SHARDED_STATE_DICT for checkpoints (the final adapter is always saved whole)",
        )


@rule("FT025", "fsdp", "SIZE_BASED_WRAP needs a positive min_num_params")
def size_wrap(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.fsdp.auto_wrap_policy == "SIZE_BASED_WRAP" and cfg.fsdp.min_num_params <= 0:
        yield error(
            cfg,
            "FT025",
            "fsdp.auto_wrap_policy",
            "SIZE_BASED_WRAP without min_num_params > 0 wraps nothing: the whole model becomes one unit "
            "and sharding saves no memory (accelerate ignores 0 silently)",
            "set `min_num_params: 100000000`, or use TRANSFORMER_BASED_WRAP",
        )


@rule("FT026", "fsdp", "wrap settings that the chosen policy ignores")
def pointless_wrap_settings(cfg: RunConfig) -> Iterator[Finding]:
    policy = cfg.fsdp.auto_wrap_policy
    if cfg.fsdp.transformer_layer_cls_to_wrap and policy != "TRANSFORMER_BASED_WRAP":
        yield warning(
            cfg,
            "FT026",
            "fsdp.transformer_layer_cls_to_wrap",
            f"ignored with {policy}",
            "remove it, or use TRANSFORMER_BASED_WRAP",
        )
    if cfg.is_set("fsdp.min_num_params") and cfg.fsdp.min_num_params and policy != "SIZE_BASED_WRAP":
        yield warning(
            cfg, "FT026", "fsdp.min_num_params", f"ignored with {policy}", "remove it, or use SIZE_BASED_WRAP"
        )
    if policy == "NO_WRAP":
        yield warning(
            cfg,
            "FT026",
            "fsdp.auto_wrap_policy",
            "NO_WRAP makes the whole model one FSDP unit: every rank gathers all of it, so sharding saves no memory",
            "use TRANSFORMER_BASED_WRAP",
        )


@rule("FT027", "fsdp", "FSDP1 reshard_after_forward is ignored when sharding_strategy decides")
def fsdp1_reshard(cfg: RunConfig) -> Iterator[Finding]:
    f = cfg.fsdp
    if f.version == 1 and cfg.is_set("fsdp.reshard_after_forward") and f.sharding_strategy:
        if STRATEGY_TO_RESHARD[f.sharding_strategy] != f.reshard_after_forward:
            yield warning(
                cfg,
                "FT027",
                "fsdp.reshard_after_forward",
                f"FSDP1 reads only sharding_strategy ({f.sharding_strategy}); this value is ignored",
                "set `fsdp_sharding_strategy` to the strategy you want",
            )


@rule("FT028", "fsdp", "FSDP1 cpu_ram_efficient_loading needs sync_module_states")
def fsdp1_sync(cfg: RunConfig) -> Iterator[Finding]:
    f = cfg.fsdp
    if f.version == 1 and f.cpu_ram_efficient_loading and f.sync_module_states is False:
        yield warning(
            cfg,
            "FT028",
            "fsdp.sync_module_states",
            "with cpu_ram_efficient_loading only rank 0 loads weights; the others need "
            "sync_module_states to receive them (forced to true)",
            "set `fsdp_sync_module_states: true`",
        )


@rule("FT029", "fsdp", "XLA/TPU FSDP is not what fsdp-tune runs")
def xla(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.fsdp.xla:
        yield error(
            cfg,
            "FT029",
            "fsdp.xla",
            "XLA (TPU) FSDP is not supported by fsdp-tune, which runs torch FSDP",
            "remove `xla`, or launch TPU runs with accelerate",
        )


@rule("FT030", "fsdp", "FSDP activation checkpointing and gradient checkpointing together")
def double_checkpointing(cfg: RunConfig) -> Iterator[Finding]:
    # transformers 5's --activation_checkpointing is the same setting (config/keys.py TRAINER_CHECKPOINTING)
    gc_set = cfg.training.is_set("gradient_checkpointing") and cfg.training.get("gradient_checkpointing")
    if cfg.fsdp.activation_checkpointing and gc_set:
        path = "training.gradient_checkpointing"
        ac = cfg.where("fsdp.activation_checkpointing")
        yield error(
            cfg,
            "FT030",
            path,
            f"{ac} and {cfg.where(path)} both recompute activations; the trainer refuses both together",
            f"drop {cfg.origin(path).key if cfg.origin(path) else path} (FSDP's activation checkpointing "
            "is the cheaper one)",
        )
    elif gc_set and cfg.fsdp.version == 2:
        said = cfg.origin("training.gradient_checkpointing")
        key = said.key if said else "--gradient_checkpointing"
        yield finding(
            cfg,
            "FT030",
            Severity.NOTE,
            "training.gradient_checkpointing",
            "under FSDP, FSDP's own activation checkpointing avoids a redundant all-gather in backward",
            f"consider `fsdp_activation_checkpointing: true` instead of {key}",
        )


@rule("FT031", "fsdp", "cpu_offload and activation offload have no effect on a CPU run", decided=True)
def offload_on_cpu(cfg: RunConfig, d: Derived) -> Iterator[Finding]:
    if cfg.fsdp.activation_checkpointing_offload and d.on_cpu:
        yield finding(
            cfg,
            "FT031",
            Severity.NOTE,
            "fsdp.activation_checkpointing_offload",
            "activation offload moves the checkpointed layer inputs from the GPU to pinned host memory; a CPU run "
            "has neither: it is turned off",
            "drop fsdp_activation_checkpointing_offload for CPU runs",
        )
    if cfg.fsdp.cpu_offload and not d.offload:
        yield finding(
            cfg,
            "FT031",
            Severity.NOTE,
            "fsdp.cpu_offload",
            "cpu_offload moves parameters from the GPU to host RAM; on a CPU run they are there already: it is "
            "turned off",
            "drop fsdp_offload_params for CPU runs",
        )


@rule("FT032", "fsdp", "activation offload needs FSDP2 and activation checkpointing")
def activation_offload(cfg: RunConfig) -> Iterator[Finding]:
    f = cfg.fsdp
    if not f.activation_checkpointing_offload:
        return
    if not f.activation_checkpointing:
        yield error(
            cfg,
            "FT032",
            "fsdp.activation_checkpointing_offload",
            "activation offload moves what FSDP's activation checkpointing keeps to host memory; with activation "
            "checkpointing off there is nothing to move (accelerate refuses it after the model is loaded)",
            "add `fsdp_activation_checkpointing: true`, or drop the offload",
        )
    if f.version != 2:
        yield error(
            cfg,
            "FT032",
            "fsdp.activation_checkpointing_offload",
            "activation offload is an FSDP2 feature (accelerate refuses it with FSDP1 after the model is loaded)",
            "`fsdp_version: 2` (fsdp-tune convert --fsdp2)",
        )


@rule("FT033", "fsdp", "FSDP1 without sharding runs with use_orig_params off")
def fsdp1_no_shard_orig_params(cfg: RunConfig) -> Iterator[Finding]:
    f = cfg.fsdp
    if fsdp1_unsharded(cfg) and f.use_orig_params is True:
        yield warning(
            cfg,
            "FT033",
            "fsdp.use_orig_params",
            "FSDP1 without sharding (NO_SHARD, or one process) loses the frozen units' parameters from the state "
            "dict after a backward pass with use_orig_params on, and the save fails ('FSDP assumes ... is in the "
            "state_dict'): it is turned off for this run",
            "drop fsdp_use_orig_params, or use FSDP2",
        )


@rule("FT034", "fsdp", "SIZE_BASED_WRAP under FSDP2 wraps a container fully_shard refuses")
def fsdp2_size_wrap(cfg: RunConfig) -> Iterator[Finding]:
    f = cfg.fsdp
    if f.version == 2 and f.auto_wrap_policy == "SIZE_BASED_WRAP" and f.min_num_params > 0:
        yield error(
            cfg,
            "FT034",
            "fsdp.auto_wrap_policy",
            "accelerate's FSDP2 size policy picks every module above min_num_params, the decoder layers' ModuleList "
            "among them, and fully_shard refuses it ('does not support containers that do not implement forward') "
            "after the model is loaded (found by fsdp-tune's combination sweep, on CPU; by reading, the same on GPU)",
            "use TRANSFORMER_BASED_WRAP (the model's decoder layers), or FSDP1's size policy (fsdp_version: 1)",
        )
