"""kto's rank hook: unpaired rows prepared once (worker/data/preference.py: pairs become two rows, shuffled with the
seed); its reference as DPO's."""

from __future__ import annotations

from trl import KTOConfig, KTOTrainer

from fsdp_tune.worker.data.preference import prepare_preference
from fsdp_tune.worker.training.methods import Method

HOOK = Method(KTOConfig, KTOTrainer, prepare_preference, (("prompt_ids", "completion_ids"),))
