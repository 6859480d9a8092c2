"""The seed launches and every peer project's Accelerate YAML must be accepted (warnings are fine)."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.validate import check
from tests.conftest import PEER_CONFIGS, REPO, seed_flags

PEERS = sorted(PEER_CONFIGS.glob("*.yaml"))


def test_peer_configs_are_in_the_repo() -> None:
    """They used to be read from ../shared and skipped without it; CI must run them."""
    assert len(PEERS) >= 6


@pytest.mark.parametrize("script", ["run_peft_fsdp.sh", "run_peft_qlora_fsdp.sh"])
def test_seed_launch_validates(script: str) -> None:
    config, flags = seed_flags(script)
    checked = check(str(REPO / config), flags)
    assert not checked.errors, checked.findings
    cfg = checked.config
    assert cfg.lora.use_peft_lora and cfg.lora.lora_r == 8 and cfg.lora.lora_target_modules == ("all-linear",)
    assert cfg.training.get("push_to_hub") is True  # bare `--push_to_hub`
    assert cfg.data.max_seq_len == 2048 and cfg.data.packing is True
    # no fsdp_version in an Accelerate YAML: FSDP2, its FSDP1 keys mapped as convert --fsdp2 maps them ...
    assert (cfg.fsdp.version, cfg.fsdp.reshard_after_forward, cfg.fsdp.use_orig_params) == (2, True, None)
    (note,) = [f for f in checked.findings if f.rule == "FT022"]  # ... said in one note, not a warning
    assert note.severity.value == "note" and "`accelerate launch` would run FSDP1" in note.message
    assert not checked.warnings


def test_qlora_seed_resolves_quant_storage() -> None:
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    cfg = check(str(REPO / config), flags).config
    q = cfg.quantization
    assert q.use_4bit_quantization and q.use_nested_quant and q.bnb_4bit_quant_storage_dtype == "bfloat16"
    assert cfg.fsdp.cpu_offload is True and cfg.launch.num_processes == 2


@pytest.mark.parametrize("name", ["fsdp_config.yaml", "fsdp_config_qlora.yaml", "fsdp2.json"])
def test_shipped_seed_configs(name: str) -> None:
    assert not check(str(REPO / "configs" / name), []).errors


def test_fsdp2_json_matches_seed() -> None:
    data = json.loads((REPO / "configs" / "fsdp2.json").read_text())
    assert data["version"] == 2 and data["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    cfg = check(str(REPO / "configs" / "fsdp2.json"), []).config
    assert cfg.fsdp.activation_checkpointing and cfg.fsdp.state_dict_type == "FULL_STATE_DICT"


@pytest.mark.parametrize("path", PEERS, ids=lambda p: p.name)
def test_peer_config_accepted(path) -> None:
    checked = check(str(path), [])
    assert not checked.errors, checked.findings


def test_peer_multinode_layout() -> None:
    cfg = check(str(PEER_CONFIGS / "llamafactory-fsdp-multinode.yaml"), []).config
    assert (cfg.launch.num_processes, cfg.launch.num_machines, cfg.launch.nproc_per_node) == (16, 2, 8)
    assert cfg.launch.main_process_ip == "192.168.0.1"
