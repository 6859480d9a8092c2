"""The training method's part of the rank spec: the arguments its TRL config takes (DPOConfig has no `packing`,
RewardConfig no `loss_type`). Pure, like rank.py.

fsdp-tune sets some SFTConfig fields for every run (max_length, packing, dataset_text_field); a method whose
config lacks one does not get it. A field the user set that the method's config lacks never gets here: FT110
refuses it first (rules/method.py).
"""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.methods import fields_of
from fsdp_tune.config.schema import RunConfig


def method_args(cfg: RunConfig, args: dict[str, Any]) -> dict[str, Any]:
    """`args` (SFTConfig's as decide.trainer_args made them) kept to the fields of the method's config."""
    fields = fields_of(cfg.run.method)
    return {k: v for k, v in args.items() if k in fields}
