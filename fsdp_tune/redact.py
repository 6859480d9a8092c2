"""Secrets never reach a file or the console: tokens, keys and passwords, by field name and by value.

A run writes its command line and config into several files people copy around (fsdp_tune_run.json, the rank
spec's `config`, the lock's record) and prints settings on the console. Values of fields named like secrets
(hub_token, *_api_key, *secret, *password, ...) and values that look like tokens (hf_..., api_org_..., sk-..., ghp_...)
are replaced by REDACTED there. Vocabulary tokens (pad_token, eos_token) are not secrets and stay. The token
a push needs reaches the ranks through their environment (HF_TOKEN), never through a file (launch/train.py).
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "<redacted>"
_SECRET_KEY = re.compile(
    r"(?i)^(token|.*(hub_token|hf_token|auth_token|access_token|api_token|api_key|apikey|secret|secret_key"
    r"|password|passwd|access_key|private_key))$"
)
# tokens by their published prefixes: Hugging Face, OpenAI and Anthropic, GitHub, GitLab, Slack, AWS access keys
_SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|api_org_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9]{20,}|sk-(proj|ant|svcacct|admin)-[A-Za-z0-9_-]{20,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_-]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16})\b"
)


def is_secret_key(name: str) -> bool:
    """A field or flag name (`--hub_token`, `training.hub_token`, `wandb_api_key`) whose value is a secret."""
    return bool(_SECRET_KEY.match(name.lstrip("-").replace("-", "_").rsplit(".", 1)[-1]))


def redact_text(text: str) -> str:
    return _SECRET_VALUE.sub(REDACTED, text)


def redact(value: Any) -> Any:
    """`value` (JSON-like data) with secret fields' values and token-like strings replaced."""
    if isinstance(value, dict):
        return {k: REDACTED if is_secret_key(str(k)) and v not in (None, "") else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return redact_text(value) if isinstance(value, str) else value


def drop_secrets(data: dict, prefix: str = "") -> list[str]:
    """Remove secret fields from `data` in place (a recipe replayed later must not pass REDACTED as a token);
    returns their dotted paths."""
    dropped = []
    for key in list(data):
        path = f"{prefix}{key}"
        if is_secret_key(str(key)):
            del data[key]
            dropped.append(path)
        elif isinstance(data[key], dict):
            dropped += drop_secrets(data[key], f"{path}.")
    return dropped


def redact_argv(argv: list[str]) -> list[str]:
    """A command line with secret flags' values (`--hub_token X`, `--hub_token=X`) and token-like words replaced."""
    out: list[str] = []
    secret_next = False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if secret_next:
            out.append(REDACTED)
        elif eq and name.startswith("-") and is_secret_key(name):
            out.append(f"{name}={REDACTED}")
        else:
            out.append(redact_text(arg))
        secret_next = not secret_next and not eq and arg.startswith("-") and is_secret_key(arg)
    return out
