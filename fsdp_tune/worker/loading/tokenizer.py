"""The tokenizer every rank loads, with the chat template the rank spec names (config/templates.py)."""

from __future__ import annotations

from fsdp_tune.config.templates import apply_template
from fsdp_tune.decide.spec import ModelSpec
from fsdp_tune.worker.loading.door import open_tokenizer


def load_tokenizer(m: ModelSpec):
    """Through the loader door (worker/loading/door.py), with the run's trust_remote_code."""
    revision = {"revision": m.revision} if m.revision else {}
    tok = open_tokenizer(m.name_or_path, m.trust_remote_code, **revision)
    return apply_template(tok, m.chat_template)
