"""rloo's rank hook: RLOOTrainer on prompts prepared once (worker/data/prompts.py), with what every generating method
shares under FSDP2 (worker/training/generating.py: its rewards, synced or gathered generation); its reference the
frozen "ref" adapter made before sharding (the row's copies_reference)."""

from __future__ import annotations

from trl import RLOOConfig, RLOOTrainer

from fsdp_tune.worker.data.prompts import prepare_prompts
from fsdp_tune.worker.training.generating import GeneratingOnFsdp, generating_kwargs
from fsdp_tune.worker.training.methods import Method

HOOK = Method(RLOOConfig, RLOOTrainer, prepare_prompts, trainer_kwargs=generating_kwargs, mixin=GeneratingOnFsdp)
