"""Regenerate fsdp_tune/config/training_fields.json from the installed TRL.

The launcher must not import trl/transformers (validate-config answers in a blink), so the names,
kinds and defaults of every SFTConfig field (and of DPOConfig, KTOConfig, RewardConfig and GRPOConfig, as they differ
from it: config/methods.py) are kept as data, and so are the values a choice-valued field
takes, read from the libraries' own enums and `choices` metadata (schedulers, optimizers, strategies,
`report_to`'s integrations, `debug`, the attention implementations transformers registers).
tests/lib/test_worker_pieces.py fails when the installed libraries drift from this table; run this script then.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import sys
import types
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "fsdp_tune" / "config" / "training_fields.json"


def _kind(tp: object) -> str:
    """Collapse a field annotation to the kinds a command-line value can be parsed into."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        kinds = {_kind(a) for a in args}
        for k in ("bool", "int", "float"):
            if kinds == {k}:
                return k
        if "list" in kinds or "float_list" in kinds:
            return "float_list" if kinds == {"float_list"} else "list"
        if "dict" in kinds:
            return "dict"
        if kinds <= {"str", "enum"}:
            return "str"
        if kinds == {"float", "int"}:
            return "float"
        return "str" if "str" in kinds else "any"
    if origin in (list, tuple):
        return "float_list" if typing.get_args(tp)[:1] == (float,) else "list"
    if origin is dict:
        return "dict"
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    if tp is float:
        return "float"
    if tp is str:
        return "str"
    if isinstance(tp, type) and issubclass(tp, str):  # ExplicitEnum subclasses str
        return "str"
    if typing.get_origin(tp) is typing.Literal:
        return "str"
    return "any"


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return None
    if hasattr(value, "value"):  # enums
        value = value.value
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def _enum_values(tp: object) -> list[str] | None:
    """The values of the first Enum (or Literal of strings) inside an annotation, list[...] included."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [str(m.value) for m in tp]
    if typing.get_origin(tp) is typing.Literal:
        args = typing.get_args(tp)
        return [a for a in args if isinstance(a, str)] or None
    for arg in typing.get_args(tp):
        found = _enum_values(arg)
        if found:
            return found
    return None


def _extra_choices() -> dict[str, list[str]]:
    """Choice-valued fields whose values are not an Enum in the annotation: the libraries' own registries."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    choices = {"report_to": [*INTEGRATION_TO_CALLBACK, "all", "none"]}
    try:  # torch.compile's modes, as torch lists them
        import torch._inductor

        choices["torch_compile_mode"] = list(torch._inductor.list_mode_options())
    except (ImportError, AttributeError):
        pass
    return choices


def _choices(f: dataclasses.Field, tp: object, extra: dict[str, list[str]]) -> list[str] | None:
    if f.name in extra:
        values = extra[f.name]
    elif f.metadata.get("choices"):
        values = [str(v) for v in f.metadata["choices"]]
    else:
        values = _enum_values(tp)
    return sorted(set(values)) if values else None


def attention_implementations() -> list[str]:
    """What `attn_implementation` may name (besides a Hub kernel `org/repo`): transformers'
    get_correct_attn_implementation accepts "eager" and every key of its AttentionInterface."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return sorted({"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()})


# the values a preference config's string field takes, from its help text (TRL lists them there, not in an Enum):
# DPOConfig.loss_type is a list of `'name'`s, KTOConfig.loss_type one of them; f_divergence_type's "Possible
# values are: `a`, `b`." and the loss types that support it, "support a non-default value: `'x'`, `'y'`."
_LOSS_NAMES = re.compile(r"`'([a-z_]+)'`")
_POSSIBLE = re.compile(r"Possible values are: ([^.]*)\.")
_SUPPORTED = re.compile(r"support a non-default value: ([^.]*)\.")


# GRPOConfig names the values of its string fields in its help text too, each field in its own words
# ("Supported values are 'grpo', ...", "Must be one of `'server'` or `'colocate'`", "at the `'token'` or `'sequence'`
# level"): the sentence that lists them, then every quoted name in it
_GRPO_LISTS = {
    "loss_type": r"Supported values are ([^.]*)\.",
    "vllm_mode": r"Must be one of ([^.]*)\.",
    "vllm_model_impl": r"Must be one of ([^.]*)\.",
    "importance_sampling_level": r"computed at the ([^.]*) level",
    "multi_objective_aggregation": r"(`'[a-z_]+'`)",
    "vllm_importance_sampling_mode": r"Supported options are: ([^.]*)\.",
    "scale_rewards": r"(`'?[a-z_]+'`)",
}
_QUOTED = re.compile(r"[`']+([a-z_]+)[`']+")


def _grpo_choices(name: str, help_text: str) -> list[str] | None:
    pattern = _GRPO_LISTS.get(name)
    if pattern is None:
        return None
    found = {v for part in re.findall(pattern, help_text) for v in _QUOTED.findall(part)}
    if not found:
        raise SystemExit(f"GRPOConfig.{name}: its help text no longer lists its values as {pattern!r}")
    return sorted(found)


def _help_choices(name: str, help_text: str, config: str = "") -> list[str] | None:
    if config == "GRPOConfig":
        return _grpo_choices(name, help_text)
    if name == "loss_type":
        return sorted(set(_LOSS_NAMES.findall(help_text))) or None
    possible = _POSSIBLE.search(help_text)
    if name == "f_divergence_type" and possible:
        return sorted(set(re.findall(r"`([a-z_]+)`", possible.group(1)))) or None
    return None


def f_divergence_losses(config_class: type) -> list[str]:
    """The DPO loss types that take a non-default f_divergence_type (DPOTrainer refuses the others)."""
    f = next(f for f in dataclasses.fields(config_class) if f.name == "f_divergence_type")
    found = _SUPPORTED.search(f.metadata.get("help", ""))
    return sorted(set(_LOSS_NAMES.findall(found.group(1)))) if found else []


def config_fields(config_class: type, extra: dict[str, list[str]]) -> dict[str, dict]:
    """One TRL config's fields: kind, default and, for a choice-valued field, its values."""
    hints = typing.get_type_hints(config_class)
    fields = {}
    for f in dataclasses.fields(config_class):
        if not f.init or f.name.startswith("_"):
            continue
        tp = hints.get(f.name, str)
        fields[f.name] = {"kind": _kind(tp), "default": _default(f)}
        choices = _choices(f, tp, extra)
        if config_class.__name__ != "SFTConfig":
            choices = _help_choices(f.name, f.metadata.get("help", ""), config_class.__name__) or choices
        if choices:
            fields[f.name]["choices"] = choices
    return dict(sorted(fields.items()))


def method_tables(sft: dict[str, dict], extra: dict[str, list[str]]) -> dict[str, dict]:
    """Each other method's config as it differs from SFTConfig: its fields that SFTConfig lacks or holds otherwise
    (another default, kind or values), and the SFTConfig fields it lacks."""
    import trl
    from trl import DPOConfig

    from fsdp_tune.methods.registry import rows

    out = {}
    others = [row for row in rows().values() if row.config_class != "SFTConfig"]
    configs = [(row.name, getattr(trl, row.config_class)) for row in others]
    for method, config_class in configs:
        own = config_fields(config_class, extra)
        out[method] = {
            "config": config_class.__name__,
            "fields": {k: v for k, v in own.items() if sft.get(k) != v},
            "absent": sorted(set(sft) - set(own)),
        }
    out["dpo"]["f_divergence_losses"] = f_divergence_losses(DPOConfig)
    return out


def build() -> dict:
    import transformers
    import trl
    from trl import SFTConfig

    extra = _extra_choices()
    fields = config_fields(SFTConfig, extra)
    return {
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "fields": fields,
        "methods": method_tables(fields, extra),
        "attn_implementation": attention_implementations(),
    }


if __name__ == "__main__":
    data = build()
    if "--check" in sys.argv:
        current = json.loads(OUT.read_text())
        sys.exit(0 if current == data else 1)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(data['fields'])} fields to {OUT}")
