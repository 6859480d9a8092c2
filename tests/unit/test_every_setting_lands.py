"""Honour or refuse: every setting fsdp-tune accepts reaches the rank spec (what the ranks execute), or a rule
refuses it (error) or says it is dropped (warning). Walks every field of the typed config, sets it to a value
other than its default, and looks for the change in the spec or for a finding that names it."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from fsdp_tune.config.lora_fields import TRL_MODEL_CONFIG, lora_fields, model_config_fields
from fsdp_tune.config.names import flag_table
from fsdp_tune.config.schema import SECTIONS, training_fields
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.validate import check

GPUS = Machine(cuda=True, gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8)
BASE = ["--output_dir", "/tmp/walk"]
# the base run every setting is changed against: LoRA on, 4 processes, the parallelism section switched on
BASE_RECIPE = {
    "launch": {"num_processes": 4},
    "lora": {"use_peft_lora": True},
    "parallelism": {"enabled": True},
    "data": {"dataset_name": "data/train.jsonl"},  # data settings describe a dataset: the base run has one
}

# Settings that act outside the rank spec, and where. Each entry is a claim a reviewer can check.
ELSEWHERE = {
    "run.overwrite_output_dir": "pre-flight: an output dir holding a run is refused without it (preflight/checks.py)",
    "parallelism.enabled": "switches the parallelism_config_* settings on; each of them is walked with it on",
    "training.resume_from_checkpoint": "resolved by launch/train.resolve_resume into RankSpec.resume_from_checkpoint",
    "training.overwrite_output_dir": "pre-flight, as run.overwrite_output_dir",
    "run.skip_memory_check": "pre-flight on GPU machines: PF050 is not checked (tests/lib/test_memory_preflight.py)",
    "data.add_special_tokens": "FT076 note: TRL 1.x decides it (a note, not a warning)",
    "data.append_concat_token": "FT076 note: TRL 1.x decides it (a note, not a warning)",
}

# SFTConfig fields fsdp-tune turns into a decision of its own (the spec's checkpointing)
DECIDED = {"gradient_checkpointing"}

# A non-default value for settings whose type alone does not give one.
VALUES = {
    "launch.main_process_ip": "10.0.0.1",
    "launch.gpu_ids": "0,1,2,3",
    "launch.distributed_type": "MULTI_GPU",
    "launch.dynamo_backend": "inductor",
    "launch.dynamo_mode": "max-autotune",
    "launch.num_processes": 8,
    "launch.num_machines": 2,
    "launch.machine_rank": 1,
    "parallelism.dp_replicate_size": 2,
    "parallelism.dp_shard_size": 2,
    "parallelism.tp_size": 2,
    "parallelism.cp_size": 2,
    "parallelism.sp_size": 2,
    "parallelism.sp_seq_length": 1024,
    "parallelism.sp_attn_implementation": "sdpa",
    "model.model_name_or_path": "some/model",
    "model.model_revision": "v2.0",
    "model.attn_implementation": "eager",
    "fsdp.transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
    "fsdp.min_num_params": 100_000_000,
    "lora.lora_target_modules": "q_proj,v_proj",
    "data.dataset_name": "data/other.jsonl",
    "data.splits": "train",
    "data.dataset_text_field": "content",
    "data.dataset_columns": "prompt=question,completion=answer",
    "data.dataset_roles": "bot=assistant",
    "data.dataset_config": "subset",
    "data.dataset_train_split": "train[:50%]",
    "data.dataset_test_split": "validation",
    "data.data_files": "a.jsonl",
    "data.data_dir": "shards",
    "data.datasets": [{"path": "a.jsonl", "format": "alpaca"}, {"path": "b.parquet", "weight": 2}],
    "data.test_split_size": 0.1,
}


def _non_default(path: str, field) -> object | None:
    if path in VALUES:
        return VALUES[path]
    default = field.default if field.default is not MISSING else None
    choices = field.metadata.get("choices")
    if choices:
        other = [c for c in choices if c != default]
        return other[0] if other else None
    if isinstance(default, bool) or field.metadata.get("kind") == "bool":
        return not default
    if isinstance(default, int):
        return default + 1 if default else 2
    if isinstance(default, float):
        return round(default / 2 + 0.01, 4)
    return None


def _recipe(tmp_path, path: str | None = None, value: object = None) -> str:
    """A recipe file setting one value (or none): every section field can be set this way, flag or not."""
    import yaml

    data: dict = {k: dict(v) for k, v in BASE_RECIPE.items()}
    if path:
        section, name = path.split(".", 1)
        data.setdefault(section, {})[name] = value
    out = tmp_path / ("setting.yaml" if path else "base.yaml")
    out.write_text(yaml.safe_dump(data))
    return str(out)


CASES = [
    (f"{section}.{f.name}", f) for section, cls in SECTIONS.items() for f in fields(cls) if not f.name.startswith("_")
]


@pytest.mark.parametrize("path,field", CASES, ids=[c[0] for c in CASES])
def test_setting_reaches_the_spec_or_a_rule(path: str, field, tmp_path) -> None:
    if path in ELSEWHERE:
        pytest.skip(ELSEWHERE[path])
    base = check(_recipe(tmp_path), BASE)
    assert not base.errors, base.findings
    value = _non_default(path, field)
    section, name = path.split(".", 1)
    if isinstance(value, bool):
        value = not getattr(getattr(base.config, section), name)  # other than the base run's
    if value is None:
        pytest.skip("no value other than the default exists")
    changed = check(_recipe(tmp_path, path, value), BASE)
    assert changed.config.origin(path) is not None, f"{path}: {value} was not read"
    key = changed.config.origin(path).key
    named = [f for f in changed.findings if f.severity.value in ("error", "warning") and f.key == key]
    if named:
        return  # refused, or dropped with a warning that says so
    if changed.errors:  # refused under another key (a rule about a combination): still not silent
        return
    before, after = decide(base.config, GPUS).as_dict(), decide(changed.config, GPUS).as_dict()
    assert before != after, f"{path}: {value} changes nothing the ranks execute and no rule says so"


TRAINING = sorted(
    name
    for name, spec in training_fields().items()
    if spec["kind"] in ("bool", "int", "float") and spec["default"] is not None
)


@pytest.mark.parametrize("name", TRAINING)
def test_training_argument_reaches_sftconfig(name: str) -> None:
    """SFTConfig fields pass to the ranks' SFTConfig as given, except those fsdp-tune decides itself (named here)."""
    path = f"training.{name}"
    if path in ELSEWHERE:
        pytest.skip(ELSEWHERE[path])
    if flag_table()[name] != path:
        pytest.skip(f"--{name} sets {flag_table()[name]}, walked with its section")
    spec = training_fields()[name]
    default = spec["default"]
    value = (not default) if spec["kind"] == "bool" else (default + 1 if spec["kind"] == "int" else default / 2 + 0.01)
    changed = check(None, [*BASE, f"--{name}", str(value)])
    if changed.errors or any(f.severity.value == "warning" and f.key == f"--{name}" for f in changed.findings):
        return
    after = decide(changed.config, GPUS)
    if name in DECIDED:  # fsdp-tune turns it into its own decision: that decision must change
        assert after.as_dict() != decide(check(None, BASE).config, GPUS).as_dict(), f"--{name} {value} is lost"
        return
    handed = after.trainer_args.kwargs().get(name)
    assert handed == changed.config.training.get(name), f"--{name} does not reach SFTConfig"


# A value other than the default for every LoraConfig field (PEFT's names, in a recipe's `lora:` section).
LORA_VALUES = {
    "task_type": "SEQ_CLS",
    "peft_type": "LORA",
    "peft_version": "0.1.0",
    "auto_mapping": {"base_model_class": "LlamaForCausalLM"},
    "base_model_name_or_path": "other/model",
    "revision": "v2.0",
    "target_modules": ["q_proj", "v_proj"],
    "exclude_modules": ["down_proj"],
    "bias": "all",
    "modules_to_save": ["lm_head"],
    "init_lora_weights": "gaussian",
    "layers_to_transform": [0],
    "layers_pattern": ["layers"],
    "rank_pattern": {"q_proj": 4},
    "alpha_pattern": {"q_proj": 8},
    "megatron_config": {"tensor_model_parallel_size": 2},
    "megatron_core": "megatron.other",
    "trainable_token_indices": [1, 2],
    "loftq_config": {"loftq_bits": 4},
    "eva_config": {"rho": 2.0},
    "corda_config": {"corda_method": "kpm"},
    "lora_ga_config": {"direction": "ArB2r"},
    "velora_config": {"rank": 2},
    "alora_invocation_tokens": [1, 2],
    "monteclora_config": {"monteclora_n": 4},
    "layer_replication": [[0, 1]],
    "runtime_config": {"ephemeral_gpu_offload": True},
    "target_parameters": ["mlp.down_proj.weight"],
    "use_bdlora": {"nblocks": 2},
    "arrow_config": {"top_k": 2},
    "kasa_config": {"k": 2},
}


def _lora_value(name: str, spec: dict) -> object:
    if name in LORA_VALUES:
        return LORA_VALUES[name]
    kind, default = spec["kind"], spec["default"]
    return {"bool": not default, "int": (default or 0) + 3, "float": 0.25}[kind]


@pytest.mark.parametrize("name", sorted(lora_fields()))
def test_every_loraconfig_field_reaches_loraconfig_or_a_rule(name: str, tmp_path) -> None:
    """PEFT's LoraConfig fields, each set by its PEFT name: it reaches the LoraConfig every rank builds
    (RankSpec.lora), or a rule with an id refuses it or says it is dropped."""
    base = check(_recipe(tmp_path), BASE)
    changed = check(_recipe(tmp_path, f"lora.{name}", _lora_value(name, lora_fields()[name])), BASE)
    key = f"lora.{name}"
    assert any(o.key == key for o in changed.config.origins.values()), f"{name} was not read"
    if any(
        f.rule.startswith("FT0") and f.key == key and f.severity.value in ("error", "warning") for f in changed.findings
    ):
        return
    assert not changed.errors, changed.findings
    before, after = decide(base.config, GPUS).lora, decide(changed.config, GPUS).lora
    assert before != after, f"{name} changes nothing in the LoraConfig and no rule says so"


@pytest.mark.parametrize("name", sorted(model_config_fields()))
def test_every_trl_model_config_flag_is_taken(name: str) -> None:
    """TRL's ModelConfig flags (trl/scripts/sft.py's command line) are fsdp-tune flags that set one setting each."""
    assert flag_table()[name] == TRL_MODEL_CONFIG[name]


# Each preference method's own config fields (DPOConfig, KTOConfig, RewardConfig beyond SFTConfig's), on a LoRA run.
METHOD_FIELDS = sorted(
    (method, name)
    for method in ("dpo", "kto", "reward")
    for name, spec in training_fields(method).items()
    if training_fields().get(name) != spec and spec["kind"] in ("bool", "int", "float") and spec["default"] is not None
)


@pytest.mark.parametrize("method,name", METHOD_FIELDS, ids=[f"{m}.{n}" for m, n in METHOD_FIELDS])
def test_method_argument_reaches_its_config(method: str, name: str) -> None:
    """A field of the method's own TRL config passes to the ranks' config as given, or a rule speaks for it."""
    spec = training_fields(method)[name]
    default = spec["default"]
    value = (not default) if spec["kind"] == "bool" else (default + 1 if spec["kind"] == "int" else default / 2 + 0.01)
    changed = check(None, [*BASE, "--use_peft_lora", "--method", method, f"--{name}", str(value)])
    said = {f.rule for f in changed.findings if f.severity.value in ("error", "warning") and f.key == f"--{name}"}
    assert not (changed.errors and not said), changed.findings  # refused, if at all, for this setting
    if said:
        return
    after = decide(changed.config, GPUS)
    assert after.method.name == method
    handed = after.trainer_args.kwargs().get(name)
    assert handed == changed.config.training.get(name), f"--{name} does not reach {method}"
