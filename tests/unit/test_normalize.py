"""Coercion, precedence, provenance and the FSDP1 -> FSDP2 tables."""

from __future__ import annotations

import pytest

from fsdp_tune.config.flags import parse_flags
from fsdp_tune.config.values import BadValue, to_bool
from fsdp_tune.validate import check


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("True", True),
        ("false", False),
        ("1", True),
        ("0", False),
        ("yes", True),
        ("no", False),
        (True, True),
        (0, False),
    ],
)
def test_bools(raw, expected) -> None:
    assert to_bool(raw) is expected


@pytest.mark.parametrize("raw", ["yes please", "2", "", None, 0.5])
def test_not_bools(raw) -> None:
    with pytest.raises(BadValue):
        to_bool(raw)


def test_flags_forms() -> None:
    assignments, findings = parse_flags(["--lora-r", "8", "--push_to_hub", "--bf16=False", "--lora_dropout", "0.05"])
    assert not findings
    got = {a.path: a.value for a in assignments}
    assert got == {
        "lora.lora_r": "8",
        "training.push_to_hub": True,
        "training.bf16": "False",
        "lora.lora_dropout": "0.05",
    }


def test_flags_override_file(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n")
    cfg = check(str(p), ["--num_processes", "4"]).config
    assert cfg.launch.num_processes == 4
    assert cfg.origin("launch.num_processes").source == "command line"


def test_provenance_cites_file_and_line(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(
        "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: true\n"
    )
    cfg = check(str(p), []).config
    assert cfg.fsdp.cpu_offload is True
    assert cfg.origin("fsdp.cpu_offload").source == f"{p}:5"
    assert cfg.origin("fsdp.cpu_offload").key == "fsdp_config.fsdp_offload_params"


def test_string_false_is_false(tmp_path) -> None:
    p = tmp_path / "f.json"
    p.write_text('{"version": 2, "cpu_offload": "false"}')
    checked = check(str(p), [])
    assert not checked.errors and checked.config.fsdp.cpu_offload is False


def test_fsdp1_strategy_sets_resharding(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n")
    cfg = check(str(p), []).config  # no fsdp_version: FSDP2 (config/fsdp2.py), the strategy as resharding
    assert (cfg.fsdp.version, cfg.fsdp.reshard_after_forward, cfg.fsdp.sharding_strategy) == (2, False, None)
    assert str(cfg.origin("fsdp.reshard_after_forward")).endswith("c.yaml:3)")  # where the strategy was written
    cfg = check(str(p), ["--fsdp_version", "1"]).config
    assert (cfg.fsdp.version, cfg.fsdp.reshard_after_forward, cfg.fsdp.sharding_strategy) == (1, False, "SHARD_GRAD_OP")


def test_fsdp1_reshard_given_as_strategy_name(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 1\n  fsdp_reshard_after_forward: SHARD_GRAD_OP\n"
    )
    cfg = check(str(p), []).config
    assert cfg.fsdp.sharding_strategy == "SHARD_GRAD_OP" and cfg.fsdp.reshard_after_forward is False


def test_fsdp2_translates_strategy_with_warning(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n")
    checked = check(str(p), [])
    assert checked.config.fsdp.reshard_after_forward is False
    assert [f.rule for f in checked.warnings] == ["FT023"]


def test_transformers_json_defaults_to_fsdp2(tmp_path) -> None:
    p = tmp_path / "f.json"
    p.write_text('{"reshard_after_forward": false}')
    assert check(str(p), []).config.fsdp.version == 2


def test_yaml_unquoted_no_is_mixed_precision_no(tmp_path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("distributed_type: FSDP\nmixed_precision: no\nfsdp_config:\n  fsdp_version: 2\n")
    assert check(str(p), []).config.launch.mixed_precision == "no"


def test_all_problems_reported_together(tmp_path) -> None:
    checked = check(
        None, ["--lora_r", "0", "--num_processes", "3", "--num_machines", "2", "--fp16", "--bf16", "--lr", "1"]
    )
    assert {"FT001", "FT060", "FT070", "FT090", "FT092"} <= {f.rule for f in checked.errors}


def test_unknown_flag_suggests() -> None:
    checked = check(None, ["--learning_rat", "1e-4"])
    (f,) = checked.errors
    assert f.rule == "FT001" and "--learning_rate" in f.hint


def test_training_field_typed() -> None:
    cfg = check(None, ["--learning_rate", "1e-4", "--report_to", "tensorboard,wandb", "--seed", "7"]).config
    assert cfg.training.get("learning_rate") == 1e-4
    assert cfg.training.get("report_to") == ("tensorboard", "wandb")
    assert cfg.training.get("seed") == 7
    assert cfg.training.get("lr_scheduler_type") == "linear"  # TRL's default when unset


def test_gradient_checkpointing_not_asked_is_not_an_error(tmp_path) -> None:
    # TRL defaults gradient_checkpointing=True; that default must not clash with FSDP AC (the run turns it off).
    p = tmp_path / "f.json"
    p.write_text('{"version": 2, "activation_checkpointing": true}')
    checked = check(str(p), [])
    assert not checked.errors and not checked.config.training.is_set("gradient_checkpointing")
