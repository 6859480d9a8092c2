"""A key given twice is refused naming both lines (#26 item 5): YAML and JSON keep the last one without a
word, and a second `training:` section dropped the first one whole. Every config format fsdp-tune reads."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.parse import duplicates
from fsdp_tune.config.readers import read_file
from fsdp_tune.errors import ConfigError
from tests.conftest import FIXTURES

runner = CliRunner()
RECIPE = "training:\n  learning_rate: 0.001\n  max_steps: 5\nmodel:\n  model_name_or_path: m\ntraining:\n  seed: 3\n"
ACCELERATE = (
    "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: false\n  fsdp_version: 1\n"
)
FSDP_YAML = "reshard_after_forward: true\nauto_wrap_policy: NO_WRAP\nreshard_after_forward: false\n"
FSDP_JSON = '{\n  "fsdp_version": 2,\n  "reshard_after_forward": true,\n  "fsdp_version": 1\n}\n'


@pytest.mark.parametrize(
    "name,text,key,lines",
    [
        ("recipe.yaml", RECIPE, "training", (1, 6)),
        ("accelerate.yaml", ACCELERATE, "fsdp_config.fsdp_version", (3, 5)),
        ("fsdp.yaml", FSDP_YAML, "reshard_after_forward", (1, 3)),
        ("fsdp.json", FSDP_JSON, "fsdp_version", (2, 4)),
    ],
)
def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, name, text, key, lines) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_file(str(path))
    [finding] = err.value.findings
    assert finding.rule == "FT007" and finding.key == key and finding.source == f"{path}:{lines[1]}"
    assert f"at lines {lines[0]} and {lines[1]}" in finding.message
    r = runner.invoke(app, ["validate-config", str(path)])
    assert r.exit_code == 2 and "FT007" in r.output


def test_inline_fsdp_config_json_and_what_is_not_a_duplicate(tmp_path) -> None:
    base = str(FIXTURES / "tiny_lora.yaml")
    r = runner.invoke(app, ["validate-config", base, "--fsdp_config", '{"version": 2, "version": 1}'])
    assert r.exit_code == 2 and "`version` is given twice" in r.output, r.output
    same_key_elsewhere = (
        "model:\n  name: a\ndata:\n  name: b\nx: &b {seed: 1}\ntraining:\n  <<: *b\n  <<: *b\n  max_steps: 2\n"
    )
    assert duplicates(tmp_path / "ok.yaml", same_key_elsewhere) == []  # other mappings, YAML merge keys: fine
    recursive = "a: &a [1, *a]\n"  # a recursive anchor: each node is walked once
    assert duplicates(tmp_path / "r.yaml", recursive) == []
