"""Start from a trained adapter (`--adapter runs/sft`, a recipe's `model: {adapter: ...}`): the adapter's weights are
the policy's start and, for DPO/KTO, the reference (unless `--reference base`).

The run takes the adapter's shape from the adapter itself, so `--adapter runs/sft` is the whole flag: its LoRA
settings (r, alpha, targets, DoRA, rsLoRA, modules_to_save, ...) and its base model fill whatever this launch left
unset; one that this launch sets to another value is refused (FT121) naming the adapter's, since the weights would
not load into another shape. Read from the adapter's run (fsdp_tune_resolved.json: the LoRA request as it was made,
`all-linear` included) when it is an fsdp-tune run, else from PEFT's adapter_config.json. No torch: the adapter
file's tensor names come from its safetensors header, read with the adapter's config through the bounded readers of
config/folders.py (a broken or hostile adapter is FT121 naming the file).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fsdp_tune.config.folders import FolderRefused, adapter_problems, read_json, tensor_names
from fsdp_tune.config.lora_fields import recorded_kwargs
from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import Origin, RunConfig
from fsdp_tune.config.values import BadValue, coerce
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.runfiles import ADAPTER_CONFIG, ADAPTER_WEIGHTS, RESOLVED_NAME

RULE = "FT121"
# LoraConfig fields that decide which tensors the adapter holds and how they scale: taken from the adapter
OWN_FIELDS = {
    "r": "lora_r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "target_modules": "lora_target_modules",
    "use_dora": "use_dora",
}
PEFT_FIELDS = (
    "use_rslora rank_pattern alpha_pattern modules_to_save bias target_parameters layers_to_transform "
    "layers_pattern exclude_modules lora_bias trainable_token_indices fan_in_fan_out"
).split()


@dataclass(frozen=True)
class StartAdapter:
    """What a starting adapter's folder says about it."""

    folder: Path
    lora: dict[str, Any]  # LoraConfig fields: the run's request when it is an fsdp-tune run, else PEFT's config
    base_model: str | None  # the model it was trained on, as that run named it (builtin:tiny-llama) or PEFT saved it
    base_paths: tuple[str, ...]  # every name the base went by (requested, and the folder it was read from)
    tensors: tuple[str, ...]  # the adapter file's tensor names
    task_type: str | None
    source: str  # the file the settings were read from (for origins and messages)


def _json(path: Path) -> Any:
    """A JSON file of the folder through the bounded reader (config/folders.py); None when it is not one."""
    try:
        return read_json(path) if path.is_file() else None
    except FolderRefused:
        return None


def read_start(folder: str) -> tuple[StartAdapter | None, str | None]:
    """(what the folder holds, None) or (None, why it cannot be a starting adapter)."""
    path = Path(folder).expanduser()
    if not path.is_dir():
        return None, f"{folder} is not a folder"
    try:
        config = read_json(path / ADAPTER_CONFIG) if (path / ADAPTER_CONFIG).exists() else None
    except FolderRefused as e:
        return None, str(e)
    if not isinstance(config, dict):
        return None, f"{folder} holds no readable {ADAPTER_CONFIG} (a finished run's folder, or a PEFT adapter)"
    problems = adapter_problems(config)
    if problems:
        return None, f"{path / ADAPTER_CONFIG}: {problems[0]}"
    if not (path / ADAPTER_WEIGHTS).is_file():
        return None, f"{folder} holds no {ADAPTER_WEIGHTS}"
    try:
        names = tensor_names(path / ADAPTER_WEIGHTS)
    except FolderRefused as e:
        return None, str(e)
    run = _json(path / RESOLVED_NAME)
    spec = run.get("spec") if isinstance(run, dict) else None
    lora = spec.get("lora") if isinstance(spec, dict) else None
    model = (spec.get("model") or {}) if isinstance(spec, dict) else {}
    base = model.get("requested") or config.get("base_model_name_or_path")
    called = (model.get("requested"), model.get("name_or_path"), config.get("base_model_name_or_path"))
    paths = tuple(p for p in called if p)
    source = str(path / (RESOLVED_NAME if isinstance(lora, dict) else ADAPTER_CONFIG))
    settings = recorded_kwargs(lora) if isinstance(lora, dict) else config
    return StartAdapter(path, settings, base, paths, names, config.get("task_type"), source), None


def _norm(value: Any) -> Any:
    if isinstance(value, (list, tuple, set)):
        return tuple(sorted(map(str, value)))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None if value in ({}, "", None) else value


def _error(cfg: RunConfig, path: str, message: str, hint: str) -> Finding:
    origin = cfg.origin(path) or cfg.origin("model.adapter")
    return Finding(RULE, Severity.ERROR, origin.key, origin.source, message, hint)


def _problems(cfg: RunConfig, start: StartAdapter) -> list[Finding]:
    """What makes the folder unusable as this run's start, whatever the LoRA settings."""
    found = []
    if str(start.task_type or "CAUSAL_LM").upper() != "CAUSAL_LM":
        why = f"{start.folder} is a {start.task_type} adapter (a reward model's head), not a causal LM's"
        found.append(_error(cfg, "model.adapter", why, "start from an SFT run's adapter"))
    if any(".embed_tokens." in n or n.endswith("lm_head.weight") for n in start.tensors):
        why = (
            f"{start.folder} carries embedding layers (its run grew the vocabulary for the chat template's tokens); "
            "a starting adapter's weights go into LoRA only"
        )
        hint = f"fsdp-tune merge --adapter {start.folder} -o MERGED, then --model_name_or_path MERGED"
        found.append(_error(cfg, "model.adapter", why, hint))
    if row_of(cfg.run.method).head == "score":
        why = "a reward model starts from its base: its score head is new, and its LoRA is a sequence classifier's"
        found.append(_error(cfg, "model.adapter", why, "drop --adapter (or --method dpo / kto)"))
    return found


def _base(cfg: RunConfig, start: StartAdapter) -> tuple[dict, dict, list[Finding]]:
    """(model changes, origins, findings): the adapter's base model when none is given, else the same one."""
    name = cfg.model.model_name_or_path
    if not name:
        if not start.base_model:
            hint = "--model_name_or_path (the model the adapter was trained on)"
            return {}, {}, [_error(cfg, "model.adapter", f"{start.folder} does not name its base model", hint)]
        return {"model_name_or_path": start.base_model}, {"model.model_name_or_path": _taken(start)}, []
    same = {str(Path(p).expanduser().resolve()) if Path(p).expanduser().exists() else p for p in start.base_paths}
    mine = str(Path(name).expanduser().resolve()) if Path(name).expanduser().exists() else name
    if start.base_paths and mine not in same and name not in start.base_paths:
        why = f"the adapter {start.folder} was trained on {start.base_model}; this run's model is {name}"
        return {}, {}, [_error(cfg, "model.model_name_or_path", why, f"--model_name_or_path {start.base_model}")]
    return {}, {}, []


def _taken(start: StartAdapter, key: str = "model_name_or_path") -> Origin:
    return Origin(key, f"the starting adapter ({start.source})")


def apply_adapter_start(cfg: RunConfig) -> tuple[RunConfig, list[Finding]]:
    """The starting adapter's base model and LoRA shape for whatever this launch left unset; FT121 for a folder
    that is no usable adapter and for settings that contradict it. Runs before TRL's LoRA defaults
    (decide/trl_defaults.py), which then find these settings set."""
    if not cfg.model.adapter:
        return cfg, []
    start, why = read_start(cfg.model.adapter)
    if start is None:  # still a LoRA run: its other findings are about the run asked for
        hint = f"--adapter RUN_DIR: the output folder of a finished run ({ADAPTER_CONFIG} + {ADAPTER_WEIGHTS})"
        lora = replace(cfg.lora, use_peft_lora=True)
        return replace(cfg, lora=lora), [_error(cfg, "model.adapter", why or "", hint)]
    findings = _problems(cfg, start)
    model, origins, found = _base(cfg, start)
    findings += found
    lora: dict[str, Any] = {"use_peft_lora": True}
    origins["lora.use_peft_lora"] = _taken(start, "use_peft_lora")
    peft = dict(cfg.peft.args)
    for theirs, ours in OWN_FIELDS.items():
        findings += _adopt(cfg, start, theirs, f"lora.{ours}", lora, origins)
    for name in PEFT_FIELDS:
        findings += _adopt(cfg, start, name, f"peft.{name}", peft, origins)
    new = replace(
        cfg,
        model=replace(cfg.model, **model),
        lora=replace(cfg.lora, **lora),
        peft=replace(cfg.peft, args=peft),
        origins={**cfg.origins, **origins},
    )
    return new, findings


def _adopt(cfg: RunConfig, start: StartAdapter, name: str, path: str, into: dict, origins: dict) -> list[Finding]:
    """One LoRA setting: the adapter's when this launch left it unset; FT121 when this launch sets another value
    (`all-linear` asked for where the adapter lists the modules PEFT resolved it to is the same request)."""
    if name not in start.lora or start.lora[name] is None:
        return []
    theirs = start.lora[name]
    field = path.split(".", 1)[1]
    if path.startswith("lora.") and name == "target_modules":
        theirs = (theirs,) if isinstance(theirs, str) else tuple(theirs)
    if cfg.is_set(path):
        mine = getattr(cfg.lora, field) if path.startswith("lora.") else cfg.peft.args.get(field)
        if mine == ("all-linear",) and name == "target_modules":
            return []
        if _norm(mine) != _norm(theirs) and name != "lora_dropout":
            why = f"the starting adapter {start.folder} has {name} {_shown(theirs)}; this launch asks {_shown(mine)}"
            hint = f"drop {cfg.origin(path).key}: the adapter's shape is taken from it"
            return [_error(cfg, path, why, hint)]
        return []
    try:
        into[field] = coerce(path, theirs)
    except BadValue as e:
        return [_error(cfg, "model.adapter", f"{start.source}: {name} {theirs!r} {e}", "check the adapter's config")]
    origins[path] = _taken(start, field)
    return []


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple, set)):
        return ",".join(map(str, sorted(map(str, value))))
    return str(value)
