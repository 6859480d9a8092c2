"""The tokenizer every rank loads, with the chat template the rank spec names (config/templates.py)."""

from __future__ import annotations

from transformers import AutoTokenizer

from fsdp_tune.config.templates import TEMPLATES
from fsdp_tune.launch.spec import ModelSpec


def load_tokenizer(m: ModelSpec):
    revision = {"revision": m.revision} if m.revision else {}
    tok = AutoTokenizer.from_pretrained(m.name_or_path, trust_remote_code=m.trust_remote_code, **revision)
    template = TEMPLATES.get(m.chat_template or "")
    if template is not None:
        # PEFT's examples add the template's special tokens; only the missing ones, so a model that
        # already speaks ChatML keeps its vocabulary (and its embeddings stay the size they were).
        missing = {
            k: template[k] for k in ("bos_token", "eos_token", "pad_token") if template[k] not in tok.get_vocab()
        }
        if missing:
            tok.add_special_tokens(missing)
        for k in ("bos_token", "eos_token", "pad_token"):
            setattr(tok, k, template[k])
        tok.chat_template = template["template"]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
