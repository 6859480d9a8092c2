"""Write a typed RunConfig as an Accelerate YAML, a Transformers fsdp_config JSON, or a recipe.

Through the typed config, not by string rewriting: every writer states the FSDP version explicitly
(the formats disagree on what a missing version means), and reading the output back gives the same
settings, as far as the target format can hold them.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from fsdp_tune.config.keys import DYNAMO_KEYS
from fsdp_tune.config.schema import SECTIONS, RunConfig, section_fields

ACCELERATE = "accelerate"
TRANSFORMERS = "transformers"
RECIPE = "recipe"
FORMATS = (ACCELERATE, TRANSFORMERS, RECIPE)

# FSDP field -> the accelerate YAML key (accelerate calls cpu_offload `offload_params`).
_ACCEL_FSDP_NAMES = {"cpu_offload": "fsdp_offload_params"}
_FSDP1_ONLY = ("sharding_strategy", "backward_prefetch", "forward_prefetch", "sync_module_states", "use_orig_params")


def fsdp_items(cfg: RunConfig) -> dict[str, Any]:
    """The FSDP settings worth writing: explicit version; FSDP1-only keys only for FSDP1 and only when set."""
    f = cfg.fsdp
    out: dict[str, Any] = {}
    for name in section_fields("fsdp"):
        value = getattr(f, name)
        if name in _FSDP1_ONLY and (f.version != 1 or value is None):
            continue
        if name == "reshard_after_forward" and f.version == 1 and f.sharding_strategy:
            continue  # FSDP1 reads sharding_strategy; writing both invites rule FT027
        if name in ("xla", "activation_checkpointing_offload") and not value:
            continue
        if name == "transformer_layer_cls_to_wrap" and not value:
            continue
        if name == "min_num_params" and not value:
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def to_accelerate(cfg: RunConfig) -> dict[str, Any]:
    lc = cfg.launch
    data: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": lc.accelerate_debug,  # with the next four, the keys accelerate's ClusterConfig requires
        "distributed_type": "FSDP",
        "mixed_precision": lc.mixed_precision,
        "num_processes": lc.num_processes,
        "num_machines": lc.num_machines,
        "machine_rank": lc.machine_rank,
    }
    if lc.main_process_ip:
        data["main_process_ip"] = lc.main_process_ip
    if cfg.is_set("launch.main_process_port") or lc.num_machines > 1:
        data["main_process_port"] = lc.main_process_port
    data["rdzv_backend"] = lc.rdzv_backend
    data["use_cpu"] = lc.use_cpu
    if lc.max_restarts:
        data["max_restarts"] = lc.max_restarts
    if lc.gpu_ids:
        data["gpu_ids"] = lc.gpu_ids
    if lc.enable_cpu_affinity:
        data["enable_cpu_affinity"] = True
    if lc.dynamo_backend.lower() != "no":
        data["dynamo_config"] = {f"dynamo_{k}": getattr(lc, f"dynamo_{k}") for k in DYNAMO_KEYS}
    data["fsdp_config"] = {_ACCEL_FSDP_NAMES.get(k, f"fsdp_{k}"): v for k, v in fsdp_items(cfg).items()}
    if cfg.parallelism.enabled:
        data["parallelism_config"] = {
            f"parallelism_config_{k}": v for k, v in _changed(cfg, "parallelism").items() if k != "enabled"
        } or {"parallelism_config_dp_replicate_size": 1}
    return data


def to_transformers(cfg: RunConfig) -> dict[str, Any]:
    return fsdp_items(cfg)


def to_recipe(cfg: RunConfig) -> dict[str, Any]:
    data: dict[str, Any] = {
        "launch": _changed(cfg, "launch", always=("num_processes", "mixed_precision")),
        "fsdp": fsdp_items(cfg),
    }
    for section in ("parallelism", "model", "data", "lora", "quantization", "run"):
        changed = _changed(cfg, section)
        if changed:
            data[section] = changed
    if cfg.peft.args:  # LoraConfig fields by PEFT's names live in the `lora:` section
        peft = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.peft.args.items()}
        data.setdefault("lora", {}).update(peft)
    if cfg.training.args:
        data["training"] = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.training.args.items()}
    return data


def _changed(cfg: RunConfig, section: str, always: tuple[str, ...] = ()) -> dict[str, Any]:
    """Fields that differ from the default or were set explicitly (a recipe need not repeat defaults)."""
    obj, default = getattr(cfg, section), SECTIONS[section]()
    out = {}
    for name in section_fields(section):
        value = getattr(obj, name)
        if name in always or value != getattr(default, name) or cfg.is_set(f"{section}.{name}"):
            if name == "distributed_type":
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def render(cfg: RunConfig, fmt: str, header: list[str] | None = None, comments: dict[str, str] | None = None) -> str:
    """Text of `cfg` in `fmt`; YAML keeps a header comment block and end-of-line comments by key."""
    if fmt == TRANSFORMERS:
        return json.dumps(to_transformers(cfg), indent=2) + "\n"
    data = to_accelerate(cfg) if fmt == ACCELERATE else to_recipe(cfg)
    lines = [f"# {h}" if not h.startswith("#") else h for h in (header or [])]
    lines += _yaml_lines(data, comments or {}, ())
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()


def _yaml_lines(data: dict[str, Any], comments: dict[str, str], prefix: tuple[str, ...]) -> list[str]:
    lines = []
    indent = "  " * len(prefix)
    for key, value in data.items():
        path = ".".join((*prefix, key))
        comment = f"  # {comments[path]}" if path in comments else ""
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:{comment}")
            lines += _yaml_lines(value, comments, (*prefix, key))
        else:
            lines.append(f"{indent}{key}: {_scalar(value)}{comment}")
    return lines


def yaml_comments(text: str) -> tuple[list[str], dict[str, str]]:
    """The leading comment block and the end-of-line comment of each key path of a YAML file."""
    header: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            header.append(line)
        elif line.strip():
            break
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0].strip().strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if " #" in line:
            comments[".".join(k for _, k in stack)] = line.split(" #", 1)[1].strip()
    return header, comments
