"""reward's rank hook: RewardTrainer on preference pairs prepared once (worker/data/preference.py), each answer
tokenized whole."""

from __future__ import annotations

from trl import RewardConfig, RewardTrainer

from fsdp_tune.worker.data.preference import prepare_preference
from fsdp_tune.worker.training.methods import Method

HOOK = Method(RewardConfig, RewardTrainer, prepare_preference, (("chosen_ids",), ("rejected_ids",)))
