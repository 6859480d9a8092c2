"""The model step: the model on the loading path the rank spec decided (decide/loading.py), and what loading
cost. Sharded loading (sharded.py) hands over a PEFT model sharded already; a model it finds it cannot build
sends the rank to from_pretrained (pretrained.py) with the transformers path's trainer config, which the
launcher decided too (RankSpec.trainer_args_on), unless the run asked for sharded loading by name.

The result is typed (Loaded): what later steps need to know about the model travels here, not as attributes
set on the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from peft import get_peft_model
from transformers import set_seed

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.worker.loading.adapter import lora_config
from fsdp_tune.worker.loading.files import FallbackRequired
from fsdp_tune.worker.loading.pretrained import load_model
from fsdp_tune.worker.loading.reference import load_start_adapter
from fsdp_tune.worker.loading.report import LoadReport
from fsdp_tune.worker.loading.sharded import build_sharded_model


@dataclass
class Loaded:
    model: Any
    args: Any  # the trainer config that trains it: the spec's, or the transformers path's after a fallback
    path: str  # the path this rank took: "sharded" | "transformers"
    vocab_grew_from: int | None  # the checkpoint's vocabulary when the chat template's tokens grew it, else None
    report: LoadReport
    peft_applied: bool = False  # on the transformers path: a starting adapter made the PEFT model here

    @property
    def prebuilt(self) -> bool:
        """Sharded loading applied LoRA already (or a starting adapter did): the trainer gets no peft_config."""
        return self.path == "sharded" or self.peft_applied


def load(spec: RankSpec, tokenizer, args, fallback_args: Callable[[], Any]) -> Loaded:
    """The model for this rank, on the spec's path; `args` trains it, `fallback_args()` makes the transformers
    path's trainer config for a rank that falls back. Sharded loading is collective: every rank calls it."""
    report = LoadReport(spec.loading.path, spec.loading.why)
    plan = spec.loading.sharded
    if plan is not None:
        rng = torch.get_rng_state()
        try:
            built = build_sharded_model(spec, tokenizer, args)
        except FallbackRequired as why:
            if not plan.may_fall_back:
                raise RuntimeError(
                    f"sharded loading was asked for (--loading sharded) and cannot load this model: {why}; "
                    "--loading auto falls back to from_pretrained on every rank"
                ) from None
            print(f"fsdp-tune: sharded loading does not apply ({why}): from_pretrained on every rank", flush=True)
            report.update(path="transformers", note=f"fell back on the ranks: {why}")
            torch.set_rng_state(rng)  # LoRA draws its initial values as on the transformers path
            args = fallback_args()
        else:
            report.update(**built.stats)
            report.model_ready()
            return Loaded(built.model, args, "sharded", built.vocab_grew_from, report)
    model, grew_from = load_model(spec, len(tokenizer))
    started = spec.model.adapter is not None and spec.lora is not None
    if started:  # the PEFT model with the starting adapter's weights; TRL adds DPO/KTO's reference copy itself
        set_seed(spec.seed)
        model = get_peft_model(model, lora_config(spec))
        load_start_adapter(model, spec.model.adapter)
    report.model_ready()
    return Loaded(model, args, "transformers", grew_from, report, peft_applied=started)
