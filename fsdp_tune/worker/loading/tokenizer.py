"""The tokenizer every rank loads, with the chat template the rank spec names (config/templates.py)."""

from __future__ import annotations

from transformers import AutoTokenizer

from fsdp_tune.config.templates import apply_template
from fsdp_tune.decide.spec import ModelSpec


def load_tokenizer(m: ModelSpec):
    revision = {"revision": m.revision} if m.revision else {}
    tok = AutoTokenizer.from_pretrained(m.name_or_path, trust_remote_code=m.trust_remote_code, **revision)
    return apply_template(tok, m.chat_template)
