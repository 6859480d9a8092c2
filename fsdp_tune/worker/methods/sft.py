"""sft's rank hook: SFTTrainer on rows converted and tokenized once, with answer masks (worker/data/prepare.py)."""

from __future__ import annotations

from trl import SFTConfig, SFTTrainer

from fsdp_tune.worker.data.prepare import prepare
from fsdp_tune.worker.training.methods import Method

HOOK = Method(SFTConfig, SFTTrainer, prepare)
