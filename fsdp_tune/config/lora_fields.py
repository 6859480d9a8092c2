"""PEFT's `LoraConfig` and TRL's `ModelConfig` as fsdp-tune settings, as data.

Every `LoraConfig` field is a flag and a `lora:` recipe key under PEFT's own name (`--use_rslora`,
`--init_lora_weights gaussian`, `--layers_to_transform 0 1`); the ones fsdp-tune has under the PEFT
example's names (`--lora_r` ...) set those. Every TRL `ModelConfig` field is a flag under TRL's name
(`--use_peft`, `--lora_target_parameters`, `--use_bnb_nested_quant` ...), so TRL's `sft.py` command line is
taken verbatim. The field lists come from the installed libraries (scripts/gen_lora_fields.py writes
lora_fields.json and model_config_fields.json); this module says what becomes of each field: it reaches
`LoraConfig` as given, or a rule refuses it (error) or drops it (warning), with the reason (VERDICTS;
rules/adapters.py raises them). A test fails when PEFT gains a field no row speaks for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from typing import Any

from fsdp_tune.typed import from_plain


@cache
def _table(name: str) -> dict[str, Any]:
    return json.loads(resources.files("fsdp_tune.config").joinpath(name).read_text())


def lora_fields() -> dict[str, dict[str, Any]]:
    """LoraConfig field -> {"kind", "default"} (kinds as config/values.py coerces them)."""
    return _table("lora_fields.json")["fields"]


def moe_tables() -> dict[str, Any]:
    """PEFT's MoE conversion: model_type -> family; per family the pre-fusion names -> fused parameter or router."""
    return _table("lora_fields.json")["moe"]


def peft_default_targets() -> dict[str, list[str]]:
    """model_type -> the modules LoraConfig(target_modules=None) adapts (PEFT's own table)."""
    return _table("lora_fields.json")["default_targets"]


def model_config_fields() -> dict[str, dict[str, Any]]:
    """TRL ModelConfig field -> {"kind", "default"}."""
    return _table("model_config_fields.json")["fields"]


@dataclass(frozen=True)
class PeftSettings:
    """The LoraConfig fields the user set by PEFT's names (beyond the `lora` section's own): name -> value."""

    args: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        if name in self.args:
            return self.args[name]
        spec = lora_fields().get(name)
        return spec["default"] if spec else None


@dataclass(frozen=True)
class LoraSpec:
    """PEFT's LoraConfig as every rank builds it (RankSpec.lora; decide/lora.py decided it): the fields fsdp-tune
    decides, typed, and the other LoraConfig fields the user set by PEFT's names. `kwargs()` is the one mapping to
    LoraConfig's arguments (the ranks' LoraConfig, worker/loading/adapter.py; the planner's count; a recorded run's
    LoRA read back by the resume check and by --adapter, `recorded_kwargs`). Here, below the rank spec, so that the
    config layer reads a finished run's record through it."""

    r: int
    lora_alpha: float
    lora_dropout: float  # 0 where a target is a parameter (decide/lora.py dropout)
    target_modules: str | list[str]  # "all-linear" or module names
    use_dora: bool
    task_type: str  # CAUSAL_LM; SEQ_CLS for a reward model (PEFT then trains the score head too)
    bias: str = "none"
    revision: str | None = None  # the base model's revision, recorded in adapter_config.json
    # a vision-language model's frozen parts excluded (one regex, decide/vision.py), else the user's, as given
    exclude_modules: str | list[str] | None = None
    modules_to_save: list[str] | None = None  # the user's, and a vision projector that trains whole
    # the other LoraConfig fields the user set by PEFT's names (config/lora_fields.py VERDICTS "pass"), as given
    peft_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        said_twice = sorted(set(self.peft_args) & {f.name for f in fields(self)})
        if said_twice:
            raise ValueError(f"LoraSpec.peft_args repeats typed field(s) {', '.join(said_twice)}")

    def kwargs(self) -> dict[str, Any]:
        """LoraConfig's arguments by PEFT's names (None: not passed, PEFT's default)."""
        named = {
            "r": self.r,
            "lora_alpha": self.lora_alpha,
            "lora_dropout": self.lora_dropout,
            "target_modules": self.target_modules,
            "use_dora": self.use_dora,
            "bias": self.bias,
            "task_type": self.task_type,
            "revision": self.revision,
            "exclude_modules": self.exclude_modules,
            "modules_to_save": self.modules_to_save,
        }
        return {**{k: v for k, v in named.items() if v is not None}, **self.peft_args}


def recorded_kwargs(plain: dict[str, Any]) -> dict[str, Any]:
    """LoraConfig's arguments from a run's recorded rank spec (its `lora`, as JSON); a spec older than LoraSpec
    (SPEC_VERSION 8) recorded the arguments themselves."""
    try:
        return from_plain(LoraSpec, plain).kwargs()
    except (TypeError, ValueError):
        return dict(plain)


# LoraConfig fields that the `lora` / `model` sections hold under the PEFT example's names.
OWN = {
    "r": "lora.lora_r",
    "lora_alpha": "lora.lora_alpha",
    "lora_dropout": "lora.lora_dropout",
    "target_modules": "lora.lora_target_modules",
    "use_dora": "lora.use_dora",
    "revision": "model.model_revision",  # the base model's revision: one setting for loading and the adapter
}

# TRL ModelConfig field -> the setting it is (TRL's sft.py builds LoraConfig / BitsAndBytesConfig from these).
TRL_MODEL_CONFIG = {
    "model_name_or_path": "model.model_name_or_path",
    "model_revision": "model.model_revision",
    "dtype": "model.dtype",
    "attn_implementation": "model.attn_implementation",
    "use_peft": "lora.use_peft_lora",
    "lora_r": "lora.lora_r",
    "lora_alpha": "lora.lora_alpha",
    "lora_dropout": "lora.lora_dropout",
    "lora_target_modules": "lora.lora_target_modules",
    "lora_target_parameters": "peft.target_parameters",
    "lora_modules_to_save": "peft.modules_to_save",
    "lora_task_type": "peft.task_type",
    "use_rslora": "peft.use_rslora",
    "use_dora": "lora.use_dora",
    "load_in_8bit": "quantization.use_8bit_quantization",
    "load_in_4bit": "quantization.use_4bit_quantization",
    "bnb_4bit_quant_type": "quantization.bnb_4bit_quant_type",
    "use_bnb_nested_quant": "quantization.use_nested_quant",
    "bnb_4bit_quant_storage": "quantization.bnb_4bit_quant_storage_dtype",
}


@dataclass(frozen=True)
class Verdict:
    """What becomes of a LoraConfig field set by its PEFT name: "pass" (reaches LoraConfig; rules may still
    check its value), "refuse" (error) or "drop" (a warning says it has no effect)."""

    action: str
    why: str = ""
    hint: str = ""


PASS = Verdict("pass")
_DATA_INIT = "needs a pass over training data on the whole, unsharded model before get_peft_model; fsdp-tune has none"
_BASE = "computes from and rewrites the base weights at init (the adapter is then relative to a changed base)"

VERDICTS: dict[str, Verdict] = {
    **dict.fromkeys(
        "task_type exclude_modules fan_in_fan_out bias use_rslora modules_to_save init_lora_weights "
        "layers_to_transform layers_pattern rank_pattern alpha_pattern trainable_token_indices velora_config "
        "alora_invocation_tokens monteclora_config lora_bias target_parameters ensure_weight_tying "
        "inference_mode".split(),
        PASS,
    ),
    **dict.fromkeys(OWN, PASS),  # set through their own settings (never stored under their PEFT name)
    "peft_type": Verdict("drop", "PEFT's bookkeeping: fsdp-tune trains LoRA (peft_type LORA)", "remove it"),
    "auto_mapping": Verdict("drop", "PEFT's bookkeeping, filled when an adapter is saved", "remove it"),
    "peft_version": Verdict("drop", "PEFT's bookkeeping, filled with the installed version on save", "remove it"),
    "base_model_name_or_path": Verdict(
        "drop", "the adapter records the model this run trains (--model_name_or_path)", "remove it"
    ),
    "runtime_config": Verdict(
        "drop", "a runtime option of loading DoRA adapters with offloaded weights; nothing to train", "remove it"
    ),
    "qalora_group_size": Verdict("drop", "only read with use_qalora, which fsdp-tune refuses", "remove it"),
    "megatron_config": Verdict("refuse", "for Megatron-LM's tensor-parallel layers; fsdp-tune runs FSDP", "remove it"),
    "megatron_core": Verdict("refuse", "for Megatron-LM's tensor-parallel layers; fsdp-tune runs FSDP", "remove it"),
    "loftq_config": Verdict(
        "refuse",
        "LoftQ needs the full-precision weights on CUDA and replaces the base with its own quantization",
        "remove it",
    ),
    "eva_config": Verdict("refuse", f"EVA {_DATA_INIT}", "remove it (and init_lora_weights eva)"),
    "corda_config": Verdict("refuse", f"CorDA {_DATA_INIT}", "remove it (and init_lora_weights corda)"),
    "lora_ga_config": Verdict("refuse", f"LoRA-GA {_DATA_INIT}", "remove it (and init_lora_weights lora_ga)"),
    "kasa_config": Verdict("refuse", f"KaSA {_BASE}; fsdp-tune saves only the adapter", "remove it"),
    "use_qalora": Verdict(
        "refuse", "QALoRA works only on GPTQ-quantized models; with bitsandbytes PEFT ignores it", "remove it"
    ),
    "layer_replication": Verdict(
        "refuse",
        "replicated layers share their base weights, which FSDP2 cannot shard in two units "
        "('is shared with a parameter already managed by another FSDP group')",
        "remove it",
    ),
    "use_bdlora": Verdict("refuse", "block-diagonal LoRA is a multi-adapter serving layout", "remove it"),
    "arrow_config": Verdict("refuse", "Arrow routes between several trained adapters at inference", "remove it"),
}

# init_lora_weights values: None = trains under FSDP2 as PEFT defines it; otherwise why it cannot.
INIT_VALUES: dict[str, str | None] = {
    "true": None,
    "false": None,
    "gaussian": None,
    "orthogonal": None,
    "pissa": f"PiSSA takes an SVD of each full weight on every rank before sharding and {_BASE}",
    "olora": f"OLoRA takes a QR of each full weight on every rank before sharding and {_BASE}",
    "mica": "MiCA takes an SVD of each full weight on every rank before sharding (of the packed bytes under 4-bit)",
    "eva": f"EVA {_DATA_INIT} (PEFT would silently train plain LoRA)",
    "corda": f"CorDA {_DATA_INIT}",
    "lora_ga": f"LoRA-GA {_DATA_INIT}",
    "loftq": "LoftQ needs the full-precision weights on CUDA and replaces the base with its own quantization",
}
