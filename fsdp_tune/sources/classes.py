"""Facts about a model's classes read from the text of transformers' modeling/configuration files (no torch):
which attention implementations its class supports, whether its embeddings are tied, and whether its config class
has an expert-parallel plan (what `DistributedConfig(ep_size=N)` applies).

transformers decides the attention when `attn_implementation` is None: SDPA when the class supports it,
else eager, without a word (modeling_utils.get_correct_attn_implementation); asked for SDPA explicitly, a
class that does not support it (Gemma 2: softcapping) refuses to load. fsdp-tune makes the same choice on the
launcher side, so the rank spec says which path runs, and refuses a request the class cannot take (FT084).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from fsdp_tune.sources import model as model_source

_HEAD = re.compile(r"^class (\w+)\(([^)]*)\):", re.M)
_FLAG = re.compile(r"^\s+_supports_(sdpa|flash_attn|flex_attn)\b[^=\n]*=\s*(True|False)[ \t]*(?:#\s*(.*))?$", re.M)
_EP_PLAN = re.compile(r"^\s+base_model_ep_plan\b[^=\n]*=\s*\{", re.M)
_TIED = re.compile(r"^\s+tie_word_embeddings\s*:[^=\n]*=\s*(True|False)", re.M)
# an attn_implementation value -> the class flag that allows it (None: always allowed; values not here: unchecked)
FLAGS = {
    "eager": None,
    "sdpa": "sdpa",
    "flash_attention_2": "flash_attn",
    "flash_attention_3": "flash_attn",
    "flex_attention": "flex_attn",
}


@dataclass(frozen=True)
class AttentionSupport:
    model_class: str
    supports: dict[str, bool]  # sdpa / flash_attn / flex_attn -> the class allows it
    why_not: dict[str, str]  # the source's own comment on a flag that is False ("sdpa does not support softcapping")

    @property
    def default(self) -> str:
        """What transformers loads when nothing is asked for."""
        return "sdpa" if self.supports["sdpa"] else "eager"


def attention_support(config: dict | None) -> AttentionSupport | None:
    """For a model whose config.json is on this machine (`config`, as the door found it); None when it is not, or
    its code is not transformers'."""
    src = model_source.for_config(config) if config else None
    if src is None:
        return None
    classes = _classes(src.modeling_file)
    archs = [a for a in config.get("architectures") or [] if a in classes]
    start = archs[0] if archs else next((c for c in classes if c.endswith("ForCausalLM")), None)
    if start is None:
        return None
    supports: dict[str, bool] = {}
    why: dict[str, str] = {}
    for cls in _lineage(classes, start):
        for flag, value, comment in _FLAG.findall(classes[cls][1]):
            if flag not in supports:
                supports[flag] = value == "True"
                if comment and value == "False":
                    why[flag] = comment.strip()
    return AttentionSupport(start, {f: supports.get(f, False) for f in ("sdpa", "flash_attn", "flex_attn")}, why)


def chosen_attention(config: dict | None, requested: str | None, use_flash_attn: bool) -> str | None:
    """The attention the ranks load: the user's, else the class's default; None (transformers decides, the same
    way) for a model that is not on this machine."""
    if use_flash_attn:
        return "flash_attention_2"
    if requested:
        return requested
    support = attention_support(config)
    return support.default if support else None


def tied_embeddings(config: dict | None) -> bool | None:
    """Whether the model's input and output embeddings share one weight: config.json (`config`, as the door found
    it), else its config class's default (Gemma ties by default, Llama does not); None when unknown."""
    if not config:
        return None
    if isinstance(config.get("tie_word_embeddings"), bool):
        return config["tie_word_embeddings"]
    path = _configuration_file(config)
    found = _TIED.search(path.read_text(encoding="utf-8", errors="replace")) if path else None
    return found.group(1) == "True" if found else None


def expert_parallel_plan(config: dict | None) -> bool | None:
    """Whether the model's config class declares `base_model_ep_plan` (transformers refuses `ep_size > 1` for a
    class without one: distributed/mixin.py `_resolve_parallel_plans`, "has no `ep_plan`"); None when the model's
    config or code is not on this machine."""
    path = _configuration_file(config)
    if path is None:
        return None
    return _EP_PLAN.search(path.read_text(encoding="utf-8", errors="replace")) is not None


def _configuration_file(config: dict | None) -> Path | None:
    src = model_source.for_config(config) if config else None
    if src is None:
        return None
    path = Path(src.modeling_file).with_name(Path(src.modeling_file).name.replace("modeling_", "configuration_"))
    return path if path.is_file() else None


@functools.lru_cache(maxsize=16)
def _classes(path: str) -> dict[str, tuple[tuple[str, ...], str]]:
    """class name -> (base names, body text) for the top-level classes of a source file."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    heads = list(_HEAD.finditer(text))
    out = {}
    for i, head in enumerate(heads):
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        bases = tuple(b.strip().split("[")[0] for b in head.group(2).split(",") if b.strip())
        out[head.group(1)] = (bases, text[head.end() : end])
    return out


def _lineage(classes: dict, start: str) -> list[str]:
    """The class and its bases defined in the same file, nearest first (PreTrainedModel's own default is False)."""
    order, queue = [], [start]
    while queue:
        cls = queue.pop(0)
        if cls in classes and cls not in order:
            order.append(cls)
            queue += list(classes[cls][0])
    return order
