"""dpo's rank hook: TRL tokenizes the preference columns prepared once (worker/data/preference.py); the reference is
a frozen adapter beside the policy's (worker/loading/reference.py), or the base on the transformers path."""

from __future__ import annotations

from trl import DPOConfig, DPOTrainer

from fsdp_tune.worker.data.preference import prepare_preference
from fsdp_tune.worker.training.methods import Method

HOOK = Method(DPOConfig, DPOTrainer, prepare_preference, (("prompt_ids", "chosen_ids"), ("prompt_ids", "rejected_ids")))
