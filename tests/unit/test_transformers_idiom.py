"""The Transformers FSDP guide's launch: `--fsdp "full_shard auto_wrap" --fsdp_config fsdp.json` is read as the
config file plus settings, the way TrainingArguments reads it (the file wins over the option string)."""

from __future__ import annotations

import json

from fsdp_tune.validate import check
from tests.conftest import REPO

FSDP2_JSON = str(REPO / "configs" / "fsdp2.json")


def test_fsdp_config_path_is_the_config_file() -> None:
    idiom = check(None, ["--fsdp", "full_shard auto_wrap", "--fsdp_config", FSDP2_JSON])
    direct = check(FSDP2_JSON, [])
    assert not idiom.errors, idiom.findings
    assert idiom.config.fsdp == direct.config.fsdp
    assert idiom.config.origin("fsdp.activation_checkpointing").source.endswith("fsdp2.json:9")
    assert "fsdp" not in idiom.config.training.args and "fsdp_config" not in idiom.config.training.args


def test_option_string_alone_sets_the_settings() -> None:
    cfg = check(None, ["--fsdp", "shard_grad_op offload auto_wrap"]).config
    assert (cfg.fsdp.version, cfg.fsdp.reshard_after_forward, cfg.fsdp.cpu_offload) == (2, False, True)
    assert cfg.origin("fsdp.cpu_offload").key == "--fsdp"
    fsdp1 = check(None, ["--fsdp", "hybrid_shard", "--fsdp_version", "1"]).config
    assert fsdp1.fsdp.sharding_strategy == "HYBRID_SHARD"


def test_inline_json_and_flags_after_it_win(tmp_path) -> None:
    inline = json.dumps({"version": 2, "cpu_offload": True, "reshard_after_forward": False})
    cfg = check(None, ["--fsdp_config", inline, "--fsdp_reshard_after_forward", "true"]).config
    assert cfg.fsdp.cpu_offload is True and cfg.fsdp.reshard_after_forward is True


def test_conflict_is_a_warning_naming_both() -> None:
    checked = check(None, ["--fsdp", "shard_grad_op", "--fsdp_config", FSDP2_JSON])
    [warning] = [f for f in checked.warnings if f.rule == "FT013"]
    assert "reshard_after_forward=false" in warning.message and "fsdp2.json:3" in warning.message
    assert checked.config.fsdp.reshard_after_forward is True  # the file wins, as in TrainingArguments
