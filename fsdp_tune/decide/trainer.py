"""The trainer's arguments, decided once: the `fsdp_config` Transformers receives (FsdpConfig) and the method's TRL
config's arguments (TrainerArgs: SFTConfig's for SFT, DPOConfig's, GRPOConfig's ...).

fsdp-tune decides some of them (the precision, the device, FSDP and its fsdp_config, checkpointing, the data's
lengths, a NaN shown as NaN): those are TrainerArgs' typed fields. The user's other training settings pass through
by TRL's names, kept to the fields of the method's config as the installed TRL has them (training_fields.json:
DPOConfig has no `packing`, RewardConfig no `loss_type`; a field the user set that the method's config lacks never
gets here, FT110 refuses it first) and checked against their kinds there: config parsing typed every value, so a
value of another kind is fsdp-tune's bug, raised here rather than on every rank. Pure, like rank.py.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from fsdp_tune.config.methods import fields_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide import vision
from fsdp_tune.decide.data import batch_multiple
from fsdp_tune.decide.derived import TRL_LOSS_FLAGS, Derived
from fsdp_tune.decide.spec import FsdpConfig, TrainerArgs

# the user's settings that do not reach the trainer as given: resolved by the launcher
# (RankSpec.resume_from_checkpoint), a secret (the ranks get it as HF_TOKEN: secret_env), TrainingArguments' no-op,
# the trainer's loss masks (our rows carry their answer masks: read as --train_on_prompt, decide/data.py), and the
# Trainer's checkpointing under its older names (TrainerArgs.activation_checkpointing and its kwargs)
NOT_PASSED = (
    "resume_from_checkpoint",
    "hub_token",
    "overwrite_output_dir",
    *TRL_LOSS_FLAGS,
    "gradient_checkpointing",
    "gradient_checkpointing_kwargs",
)
# the Python types of the kinds training_fields.json records (scripts/gen_training_fields.py _kind); "any": any
KIND_TYPES: dict[str, type] = {
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "list": list,
    "float_list": list,
    "dict": dict,
}
FSDP1_ONLY = ("backward_prefetch", "forward_prefetch", "use_orig_params", "sync_module_states")  # as the user set them
# TrainerArgs' typed fields every method's config has (TrainingArguments'); the others only where the config has them
_EVERY_CONFIG = ("output_dir", "use_cpu", "fsdp", "fsdp_config", "activation_checkpointing", "report_to")


def fsdp_config(cfg: RunConfig, d: Derived) -> FsdpConfig:
    """Transformers' `fsdp_config`, as TrainingArguments reads it."""
    f = cfg.fsdp
    fsdp1: dict[str, Any] = {}
    if f.version == 1:
        reshard: bool | str = f.sharding_strategy or ("FULL_SHARD" if f.reshard_after_forward else "SHARD_GRAD_OP")
        fsdp1 = {k: getattr(f, k) for k in FSDP1_ONLY}
        if d.fsdp1_unsharded:
            # transformers' FSDP1 default is use_orig_params=true, which loses the frozen parameters from the
            # state dict of a NO_SHARD unit after backward (FT033 warns when it was asked for); false saves fine
            fsdp1["use_orig_params"] = False
    else:
        reshard = f.reshard_after_forward
    layers = vision.layer_classes(cfg, d.model)  # a vision model's: both towers
    by_class = f.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" and layers
    return FsdpConfig(
        version=f.version,
        cpu_offload=d.offload,
        auto_wrap_policy=f.auto_wrap_policy,
        state_dict_type=f.state_dict_type,
        cpu_ram_efficient_loading=f.cpu_ram_efficient_loading,
        activation_checkpointing=f.activation_checkpointing,
        reshard_after_forward=reshard,
        **fsdp1,
        transformer_layer_cls_to_wrap=list(layers) if by_class else None,
        min_num_params=f.min_num_params if f.auto_wrap_policy == "SIZE_BASED_WRAP" else None,
    )


def trainer_args(cfg: RunConfig, d: Derived, output_dir: str, fsdp: FsdpConfig, accelerate_fsdp: bool) -> TrainerArgs:
    """The method's config's arguments: what fsdp-tune decides, and the user's other training settings (`fsdp`: the
    fsdp_config the Trainer gets on the run's loading path; `accelerate_fsdp` false when transformers shards the
    model at load, expert parallelism: accelerate must not wrap it again, its FSDP plugin off)."""
    method = cfg.run.method
    user = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.training.args.items()}
    kwargs = user.get("gradient_checkpointing_kwargs") or {}
    user = {k: v for k, v in user.items() if k not in NOT_PASSED}
    typed = {f.name for f in fields(TrainerArgs)} - {"trl_args", "precision"} | {"bf16", "fp16"}
    said = method_args(method, {k: user.pop(k) for k in sorted(set(user) & typed)})  # the user's, of a typed field
    checkpointing = d.gradient_checkpointing  # transformers 5's name for the Trainer's gradient checkpointing
    multiple = batch_multiple(cfg)  # context parallelism's chunks, as the spec's data (decide/data.py)
    ours = {
        "activation_checkpointing_kwargs": {"use_reentrant": cfg.run.use_reentrant, **kwargs}
        if checkpointing
        else None,
        "ddp_backend": "gloo" if d.on_cpu else said.get("ddp_backend"),
        "max_length": cfg.data.max_seq_len,
        "packing": cfg.data.packing,
        "dataset_text_field": cfg.data.dataset_text_field,
        "pad_to_multiple_of": multiple if multiple is not None else said.get("pad_to_multiple_of"),
        # a NaN must show as NaN (see NanGuardCallback); fp16's scaler skips its inf steps by design
        "logging_nan_inf_filter": said.get("logging_nan_inf_filter", None if d.precision == "fp16" else False),
        # a vision-language model's rows keep their images (the Trainer drops the columns forward does not name)
        "remove_unused_columns": False if vision.keeps_columns(d.model) else said.get("remove_unused_columns"),
    }
    taken = fields_of(method)
    _every_config_has(method, taken)
    return TrainerArgs(
        output_dir=output_dir,
        precision=d.precision,
        use_cpu=d.on_cpu,
        fsdp=accelerate_fsdp,
        fsdp_config=fsdp,
        activation_checkpointing=checkpointing,
        report_to=said.get("report_to", "none"),
        **{k: v if k in taken else None for k, v in ours.items()},
        trl_args=method_args(method, user),
    )


def method_args(method: str, args: dict[str, Any]) -> dict[str, Any]:
    """The user's settings (by TRL's names) kept to the fields of the method's config, each of its field's kind."""
    taken = fields_of(method)
    kept = {k: v for k, v in args.items() if k in taken}
    for name, value in kept.items():
        kind = taken[name]["kind"]
        want = KIND_TYPES.get(kind)
        if want is not None and value is not None and (not isinstance(value, want) or _bool_as_number(value, want)):
            raise TypeError(
                f"training setting {name}={value!r} is a {type(value).__name__}, and {method}'s config takes a "
                f"{kind} (training_fields.json): the config parsing should have made it one"
            )
    return kept


def _bool_as_number(value: Any, want: type) -> bool:
    return isinstance(value, bool) and want is not bool


def _every_config_has(method: str, taken: dict[str, Any]) -> None:
    """TrainerArgs always passes these (and bf16/fp16): TrainingArguments' fields, in every method's config."""
    missing = [k for k in (*_EVERY_CONFIG, "bf16", "fp16") if k not in taken]
    if missing:
        said = ", ".join(missing)
        raise TypeError(f"{method}'s config has no {said} (training_fields.json): TrainerArgs passes them")
