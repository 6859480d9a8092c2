"""The CLI through Typer's runner: exit codes, message text, JSON, and the speed rule (no torch import)."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from tests.conftest import FIXTURES, REPO

runner = CliRunner()
CFG = str(FIXTURES / "configs")


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_valid_prints_resolved_settings() -> None:
    r = invoke("validate-config", "--config", f"{CFG}/accel_fsdp2_lora.yaml", "--use_peft_lora", "True")
    assert r.exit_code == 0, r.output
    assert "fsdp.activation_checkpointing" in r.output and "ok:" in r.output


def test_positional_config_and_hyphen_flags() -> None:
    r = invoke("validate-config", f"{CFG}/tf_fsdp2.json", "--use-peft-lora", "--lora-r", "16", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)  # the positional file was read, and the hyphenated flags reached their settings
    assert data["valid"] is True and data["format"] == "transformers"
    assert data["config"]["lora"]["use_peft_lora"] is True and data["config"]["lora"]["lora_r"] == 16
    assert data["config"]["fsdp"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]  # from the file


def test_invalid_exits_2_with_key_source_and_hint() -> None:
    r = invoke("validate-config", f"{CFG}/accel_bad_values.yaml")
    assert r.exit_code == 2
    assert "FT024 fsdp_config.fsdp_state_dict_type (" in r.output and "accel_bad_values.yaml:7)" in r.output
    assert "hint:" in r.output and "Traceback" not in r.output


def test_strict_turns_warnings_into_errors() -> None:
    path = f"{CFG}/accel_fsdp1_hybrid.yaml"
    relaxed = invoke("validate-config", path, "--fsdp_version", "1")  # FT022: FSDP1 is deprecated
    assert relaxed.exit_code == 0 and "FT022" in relaxed.output and "ok:" in relaxed.output
    strict = invoke("validate-config", path, "--fsdp_version", "1", "--strict")
    assert strict.exit_code == 2 and "FT022" in strict.output
    assert "error: warnings are errors with --strict" in strict.output and "ok:" not in strict.output


def test_json_output() -> None:
    r = invoke("validate-config", f"{CFG}/tf_bad_bool.json", "--json")
    assert r.exit_code == 2
    data = json.loads(r.stdout)
    assert data["valid"] is False and data["format"] == "transformers"
    assert data["findings"][0]["rule"] == "FT010" and data["findings"][0]["key"] == "cpu_offload"
    r = invoke("validate-config", f"{CFG}/tf_fsdp2.json", "--json")
    assert json.loads(r.stdout)["config"]["fsdp"]["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]


def test_missing_file_and_bad_syntax(tmp_path) -> None:
    r = invoke("validate-config", str(tmp_path / "nope.yaml"))
    assert r.exit_code == 2 and "does not exist" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 2,,}')
    r = invoke("validate-config", str(bad))
    assert r.exit_code == 2 and "bad.json:1" in r.output and "not valid JSON" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("distributed_type: FSDP\nfsdp_config:\n  - [unclosed\n")
    r = invoke("validate-config", str(bad))
    assert r.exit_code == 2 and "not valid YAML" in r.output


def test_unrecognisable_file(tmp_path) -> None:
    p = tmp_path / "x.yaml"
    p.write_text("hello: world\n")
    r = invoke("validate-config", str(p))
    assert r.exit_code == 2 and "cannot tell which kind of config" in r.output


def test_rules_lists_catalog() -> None:
    from fsdp_tune.rules.catalog import catalog

    r = invoke("rules")
    assert r.exit_code == 0
    listed = [line.split(None, 2) for line in r.output.splitlines() if line.strip()]
    assert [tuple(row) for row in listed] == catalog()  # every rule, with its family and title, in order
    assert {"FT001", "FT030", "FT044", "FT052", "FT090"} <= {row[0] for row in listed}


def test_validate_config_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from fsdp_tune.cli.app import app\n"  # first, as the command itself does (rich is kept out then)
        "from typer.testing import CliRunner\n"
        f"r = CliRunner().invoke(app, ['validate-config', '{REPO}/configs/fsdp_config_qlora.yaml', '--use_peft_lora',"
        " '--use_4bit_quantization', 'True', '--bnb_4bit_quant_storage_dtype', 'bfloat16'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = [m for m in ('torch', 'transformers', 'accelerate', 'peft', 'trl', 'bitsandbytes', 'datasets',"
        " 'rich') if sys.modules.get(m) is not None]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "", f"validate-config imported: {out.stdout}"
