"""did-you-mean for unknown keys and flags."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, known: Iterable[str], prefix: str = "") -> str:
    known = list(known)
    norm = name.lower().replace("-", "_")
    matches = difflib.get_close_matches(norm, known, n=1, cutoff=0.6)
    if not matches:
        # a key with a prefix the other tool uses (fsdp_/parallelism_config_) still deserves a hint
        matches = [k for k in known if norm.endswith(k) or k.endswith(norm)][:1]
    return f"did you mean `{prefix}{matches[0]}`?" if matches else ""
