"""A resume that cannot continue its checkpoint, refused before any rank starts (PF039, PF051): the FSDP version,
the adapter's shape (r, alpha, targets, DoRA, rsLoRA, ...), the method (full fine-tune, LoRA, DoRA, 4-bit) or the
base model differ from what the checkpoint was trained with. Loaded anyway, a different shape fails on every rank after
the model has loaded ("size mismatch"), and a different alpha or method silently changes what training means.

What the checkpoint was: its own adapter_config.json (the ranks write PEFT's into every checkpoint), else the
rank spec of the run that wrote it (OUTPUT_DIR/fsdp_tune_resolved.json, when its run id is the checkpoint's),
else the finished adapter of that run. No torch.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fsdp_tune.config.lora_fields import lora_fields, recorded_kwargs
from fsdp_tune.config.methods import fields_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import RankSpec, recorded_fsdp_version, recorded_trainer_kwargs
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rundir.checkpoints import folder_run_id, marker_run_id
from fsdp_tune.runfiles import ADAPTER_CONFIG, RESOLVED_NAME

# LoraConfig fields that decide the adapter's tensors or what they mean (not dropout or init: they only start it)
SHAPE = (
    "r",
    "lora_alpha",
    "target_modules",
    "use_dora",
    "use_rslora",
    "target_parameters",
    "modules_to_save",
    "layers_to_transform",
    "layers_pattern",
    "rank_pattern",
    "alpha_pattern",
    "exclude_modules",
    "bias",
    "lora_bias",
    "trainable_token_indices",
    "fan_in_fan_out",
)
# what PEFT's adapter_config.json alone can be compared on (PEFT rewrites the rest when it builds the model)
CORE = ("r", "lora_alpha", "use_dora", "use_rslora", "target_modules")
# how the user sets each (a PEFT field without one of our names is a flag under its own)
FLAGS = {"r": "--lora_r", "lora_alpha": "--lora_alpha", "target_modules": "--lora_target_modules"}


def resume_findings(checkpoint: str | None, spec: RankSpec) -> list[Finding]:
    if not checkpoint:
        return []
    before = _previous(Path(checkpoint), spec.output_dir)
    if before is None:
        return []
    differences = _differences(before, spec)
    if not differences:
        return []
    said = "; ".join(f"{what} {was} (this launch: {now})" for what, was, now, _ in differences)
    fix = " ".join(flag for *_, flag in differences if flag)
    return [
        Finding(
            "PF039",
            Severity.ERROR,
            "--resume_from_checkpoint",
            "command line",
            f"{checkpoint} was trained with {said}: it cannot continue as this launch asks (a different shape "
            "fails loading on every rank; a different scale or method changes the run without a word)",
            (f"resume with the checkpoint's settings ({fix}), or " if fix else "")
            + "start a new run in another --output_dir (the checkpoint stays as it is)",
        )
    ]


# What a resume takes from the checkpoint whatever this launch says: torch's Optimizer.load_state_dict keeps the
# saved param_groups' hyperparameters (lr, weight_decay, betas, eps), LambdaLR.load_state_dict the saved base_lrs
# (the learning rate); the schedule's function is rebuilt from this launch's settings at the restored step, so a
# changed type, warmup or total bends the curve mid-way (a linear schedule ended at 0 jumps back up).
RESTORED = ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")
SHAPED = ("lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio")
# schedules whose curve does not depend on the total number of steps (an integer warmup at most)
TOTAL_FREE = ("constant", "constant_with_warmup", "inverse_sqrt", "reduce_lr_on_plateau")


def schedule_findings(checkpoint: str | None, spec: RankSpec) -> list[Finding]:
    """PF065: a resume whose learning rate, optimizer settings or schedule differ from the run's that wrote the
    checkpoint (its rank spec, when the run id is the checkpoint's). Resumed anyway, the checkpoint's values win
    without a word while the run's record says this launch's; so it is refused, with both ways on."""
    then = _trained_args(Path(checkpoint), spec.output_dir) if checkpoint else None
    if then is None:
        return []
    now, defaults = spec.trainer_args.kwargs(), fields_of(spec.method.name)

    def value(args: dict, name: str) -> Any:
        return _norm(args.get(name, (defaults.get(name) or {}).get("default")))

    changed = [k for k in (*RESTORED, *SHAPED) if value(then, k) != value(now, k)]
    total = _total(then, value) != _total(now, value)
    if total and (_depends_on_total(then, value) or _depends_on_total(now, value)):
        changed += [k for k in ("max_steps", "num_train_epochs") if value(then, k) != value(now, k)]
    if not changed:
        return []
    said = "; ".join(f"{k} {_show(value(then, k))} (this launch: {_show(value(now, k))})" for k in changed)
    keep = " ".join(f"--{k} {_show(value(then, k))}" for k in changed if value(then, k) is not None)
    return [
        Finding(
            "PF065",
            Severity.ERROR,
            f"--{changed[0]}",
            "command line",
            f"{checkpoint} was trained with {said}: a resume keeps the checkpoint's learning rate and optimizer "
            "settings (optimizer.pt, scheduler.pt) and lays the schedule's shape and length out anew at the step it "
            "stopped, so it would train neither as the checkpoint did nor as this launch asks",
            f"resume with the checkpoint's settings ({keep or 'leave those flags out'}), or train on from its adapter "
            f"as a new run with a schedule of its own: {_new_run(Path(checkpoint), spec.output_dir)} "
            f"{_more_steps(then, now, value)}--output_dir {spec.output_dir.rstrip('/')}-more",
        )
    ]


def _trained_args(checkpoint: Path, output_dir: str) -> dict[str, Any] | None:
    """The trainer arguments of the run that wrote `checkpoint`: its folder's rank spec when its run id is the
    checkpoint's (a checkpoint from elsewhere: unknown, not compared), as the method's config received them (a spec
    older than TrainerArgs, 9, recorded them so)."""
    run_id = marker_run_id(checkpoint)
    record = _json(Path(output_dir) / RESOLVED_NAME)
    if not isinstance(record, dict) or run_id is None or record.get("run_id") != run_id:
        return None
    args = (record.get("spec") or {}).get("trainer_args")
    return recorded_trainer_kwargs(args) if isinstance(args, dict) else None


def _total(args: dict, value) -> tuple[str, Any]:
    steps = value(args, "max_steps")
    return (
        ("max_steps", steps)
        if steps is not None and steps > 0
        else ("num_train_epochs", value(args, "num_train_epochs"))
    )


def _depends_on_total(args: dict, value) -> bool:
    warmup, ratio = value(args, "warmup_steps") or 0, value(args, "warmup_ratio") or 0
    return value(args, "lr_scheduler_type") not in TOTAL_FREE or 0 < warmup < 1 or ratio > 0


def _more_steps(then: dict, now: dict, value) -> str:
    """`--max_steps N ` for the steps this launch adds to a run that ran to max_steps, else nothing."""
    (kind, was), (kind_now, will) = _total(then, value), _total(now, value)
    if kind == kind_now == "max_steps" and will > was:
        return f"--max_steps {int(will - was)} "
    return ""


def _new_run(checkpoint: Path, output_dir: str) -> str:
    """`--adapter X` to start a new run from: the checkpoint's own adapter when it holds one (whole checkpoints),
    else the run's finished one; a sharded checkpoint of a run not finished has none to start from yet."""
    for folder in (checkpoint, Path(output_dir)):
        if (folder / ADAPTER_CONFIG).exists() and any(folder.glob("adapter_model.*")):
            return f"--adapter {folder}"
    return f"once the run has finished (resumed as it was), --adapter {output_dir}"


def written_by_fsdp(checkpoint: Path) -> int | None:
    """The FSDP version of the run that wrote a checkpoint: its folder's rank spec (machine 0's), None when that
    folder holds none (a checkpoint copied from elsewhere, or written by an fsdp-tune before rank specs)."""
    for name in (RESOLVED_NAME, f"node0-{RESOLVED_NAME}"):
        record = _json(checkpoint.parent / name)
        try:
            return recorded_fsdp_version(record["spec"])
        except (KeyError, TypeError, ValueError):
            continue
    return None


def written_sharded_at_load(checkpoint: Path) -> int | None:
    """The ep_size of the run that wrote a checkpoint when transformers sharded its model at load (its rank spec's
    loading.distributed_config: the same JSON since spec 7, a DistributedSizes since 9), 1 when accelerate's FSDP
    did; None when its folder holds no rank spec that says."""
    for name in (RESOLVED_NAME, f"node0-{RESOLVED_NAME}"):
        record = _json(checkpoint.parent / name)
        try:
            return int((record["spec"]["loading"].get("distributed_config") or {}).get("ep_size", 1))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return None


def sharded_at_load_findings(checkpoint: str | None, cfg: RunConfig) -> list[Finding]:
    """PF051: a checkpoint of a model sharded at load (expert parallelism) holds the replicated adapter and the
    Trainer's optimizer.pt; accelerate's FSDP checkpoints hold its own layout: neither resumes the other."""
    from fsdp_tune.decide.derived import expert_parallel_size

    theirs = written_sharded_at_load(Path(checkpoint)) if checkpoint else None
    ours = expert_parallel_size(cfg)
    if theirs is None or (theirs > 1) == (ours > 1):
        return []
    how = {True: "expert parallelism (ep_size > 1: transformers sharded the model at load)", False: "FSDP alone"}
    return _layout_refusal(
        f"{checkpoint} was written under {how[theirs > 1]}, and this launch runs {how[ours > 1]}: the two "
        "checkpoint the adapter and the optimizer state in different layouts",
        f"--use_parallelism_config --ep_size {theirs} resumes it as it was written"
        if theirs > 1
        else "drop ep_size to resume it as it was written",
    )


def _layout_refusal(message: str, hint: str) -> list[Finding]:
    """PF051: the checkpoint's layout is not the one this launch would read it with."""
    return [Finding("PF051", Severity.ERROR, "--resume_from_checkpoint", "command line", message, hint)]


def fsdp_version_findings(checkpoint: str | None, cfg: RunConfig) -> list[Finding]:
    """PF051: FSDP1 and FSDP2 lay out sharded weights and optimizer state differently, so a checkpoint is resumed
    by the version that wrote it (a config without fsdp_version now runs FSDP2: config/fsdp2.py); so do a model
    sharded at load and one FSDP shards (sharded_at_load_findings)."""
    from fsdp_tune.config.fsdp2 import version_note

    theirs = written_by_fsdp(Path(checkpoint)) if checkpoint else None
    ours = cfg.fsdp.version
    if theirs is None or theirs == ours:
        return sharded_at_load_findings(checkpoint, cfg)
    why = f" ({version_note(cfg)})" if version_note(cfg) else ""
    return _layout_refusal(
        f"{checkpoint} was written by FSDP{theirs}, and this launch runs FSDP{ours}{why}: the two lay out "
        "sharded weights and optimizer state differently",
        f"--fsdp_version {theirs} resumes it as it was written",
    )


def _previous(checkpoint: Path, output_dir: str) -> dict[str, Any] | None:
    """What the checkpoint was, as far as the files tell (a key missing: unknown, not compared), or None:
    "lora" (LoraConfig fields, None for a full fine-tune), "fields" (those to compare), "trained_targets" (the
    module names PEFT resolved), "method", "model". The run's own rank spec is the request as it was made, so it
    compares like with like; PEFT's adapter_config.json holds what PEFT made of it (`all-linear` resolved, MoE
    experts turned into target_parameters), so alone it speaks only for the core fields."""
    run_id = marker_run_id(checkpoint)
    spec = _json(Path(output_dir) / RESOLVED_NAME)
    same_run = isinstance(spec, dict) and run_id is not None and spec.get("run_id") == run_id
    record = spec.get("spec") if same_run else None
    config = _json(checkpoint / ADAPTER_CONFIG)
    if config is None and run_id is not None and folder_run_id(output_dir) == run_id:
        config = _json(Path(output_dir) / ADAPTER_CONFIG)  # the run's finished adapter, same shape
    trained = config.get("target_modules") if isinstance(config, dict) else None
    if isinstance(record, dict):
        lora, model = record.get("lora"), record.get("model") or {}
        lora = recorded_kwargs(lora) if isinstance(lora, dict) else None
        return {
            "lora": lora,
            "fields": SHAPE,
            "trained_targets": trained,
            "method": _method(lora, model.get("quantization")),
            "model": model.get("requested"),
            "training method": _method_name(record.get("method")),
        }
    if isinstance(config, dict):
        return {"lora": config, "fields": CORE, "trained_targets": trained}
    return None


def _method_name(recorded) -> str:
    """The method a checkpoint's run trained with: its rank spec's method part (version 3), or its name alone
    (version 2), or SFT before either."""
    if isinstance(recorded, dict):
        return str(recorded.get("name") or "sft")
    return str(recorded or "sft")


def _differences(before: dict[str, Any], spec: RankSpec) -> list[tuple[str, str, str, str]]:
    """(what, the checkpoint's value, this launch's, the flag that sets the checkpoint's) for each difference."""
    found = []
    if before.get("model") and before["model"] != spec.model.requested:
        found.append(("base model", before["model"], spec.model.requested, f"--model_name_or_path {before['model']}"))
    if before.get("training method", spec.method.name) != spec.method.name:
        found.append(
            ("training method", before["training method"], spec.method.name, f"--method {before['training method']}")
        )
    q = spec.model.quantization
    new = spec.lora.kwargs() if spec.lora is not None else None
    method = _method(new, asdict(q) if q is not None else None)  # as a run's record holds it (JSON)
    if "method" in before and before["method"] != method:
        found.append(("method", before["method"], method, ""))
        return found
    old = before.get("lora")
    if old is None or new is None:
        return found
    defaults = lora_fields()
    for name in before["fields"]:
        default = (defaults.get(name) or {}).get("default")
        was, now = _norm(old.get(name, default)), _norm(new.get(name, default))
        asked = was
        if name == "target_modules":
            was = _targets(_norm(before.get("trained_targets")), was, now)
        if was is not _UNKNOWN and was != now:
            flag = FLAGS.get(name, f"--{name}")
            found.append((name, _show(was), _show(now), f"{flag} {_show(asked, flag=True)}"))
    return found


_UNKNOWN = object()


def _targets(trained: Any, requested: Any, now: Any) -> Any:
    """What to compare this launch's targets with: `all-linear` (a string) with the request as it was made, a
    list of names with the names PEFT resolved and trained, else with the request (a list asked for where
    `all-linear` was is another request: the hint says how to repeat the first); _UNKNOWN when nothing says."""
    if isinstance(now, str):
        return requested if isinstance(requested, str) else _UNKNOWN
    if isinstance(trained, tuple):
        return trained
    return requested if requested is not None else _UNKNOWN


def _method(lora: dict | None, quantization: dict | None) -> str:
    q = quantization or {}
    bits = "4-bit " if q.get("load_in_4bit") else "8-bit " if q.get("load_in_8bit") else ""
    if lora is None:
        return bits + "full fine-tune"
    return bits + ("DoRA" if lora.get("use_dora") else "LoRA")


def _norm(value: Any) -> Any:
    """One spelling per value: lists as sorted tuples (PEFT saves target_modules as a set), empties as None."""
    if value in (None, "", [], {}, ()):
        return None
    if isinstance(value, (list, tuple, set)):
        return tuple(sorted(map(str, value)))
    if isinstance(value, dict):
        return tuple(sorted((str(k), v) for k, v in value.items()))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def _show(value: Any, flag: bool = False) -> str:
    if isinstance(value, tuple):
        return (" " if flag else ",").join(str(v[0] if isinstance(v, tuple) else v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
