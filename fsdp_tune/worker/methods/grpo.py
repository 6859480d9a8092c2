"""grpo's rank hook: prompts prepared once (worker/data/prompts.py); the completions generated on the ranks and
scored by the spec's rewards, generation synced across ranks, the reference as the adapter off: what every
generating method shares (worker/training/generating.py)."""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer

from fsdp_tune.worker.data.prompts import prepare_prompts
from fsdp_tune.worker.training.generating import GeneratingOnFsdp, generating_kwargs
from fsdp_tune.worker.training.methods import Method

HOOK = Method(GRPOConfig, GRPOTrainer, prepare_prompts, trainer_kwargs=generating_kwargs, mixin=GeneratingOnFsdp)
