"""The training method's part of the rank spec: its row's traits (MethodSpec), the batch and checkpoint schedule
its config will read (Steps), and the arguments its TRL config takes (DPOConfig has no `packing`, RewardConfig no
`loss_type`). Pure, like rank.py.

fsdp-tune sets some SFTConfig fields for every run (max_length, packing, dataset_text_field); a method whose
config lacks one does not get it. A field the user set that the method's config lacks never gets here: FT110
refuses it first (rules/method.py).
"""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.methods import fields_of, row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.spec import MethodSpec, Steps


def method_args(cfg: RunConfig, args: dict[str, Any]) -> dict[str, Any]:
    """`args` (SFTConfig's as decide.trainer_args made them) kept to the fields of the method's config."""
    fields = fields_of(cfg.run.method)
    return {k: v for k, v in args.items() if k in fields}


def method_spec(cfg: RunConfig) -> MethodSpec:
    """The method's row, as the ranks execute it (config/methods.py)."""
    row = row_of(cfg.run.method)
    return MethodSpec(
        name=row.name,
        data=row.data,
        head=row.head,
        reference_adapter=row.reference,
        truncation=row.truncation,
    )


def steps(cfg: RunConfig) -> Steps:
    """The batch, the end and the checkpoint schedule as the method's config will read them: the run's settings,
    else that config's defaults (TrainingSettings.get: training_fields.json, read from the installed TRL)."""
    value = cfg.training.get
    return Steps(
        per_device_train_batch_size=int(value("per_device_train_batch_size")),
        gradient_accumulation_steps=int(value("gradient_accumulation_steps")),
        max_steps=int(value("max_steps")),
        max_grad_norm=float(value("max_grad_norm") or 0.0),
        optim=str(value("optim")),
        save_strategy=value("save_strategy"),
        save_steps=float(value("save_steps")),
        save_total_limit=value("save_total_limit"),
    )
