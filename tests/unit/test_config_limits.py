"""Config files are bounded before they are parsed (#17, defect 6): size, nesting and alias expansion refused
in milliseconds (FT006, exit 2); trust_remote_code names the code every rank will run (FT083)."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.readers import read_file
from fsdp_tune.errors import ConfigError
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")
runner = CliRunner()


def alias_bomb() -> str:
    """The classic billion laughs: 9 levels of 9 aliases, under 700 bytes."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 10):
        lines.append(f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]")
    return "\n".join(["training:", "  seed: 1", *lines]) + "\n"


@pytest.mark.parametrize(
    "name,text,says",
    [
        ("bomb.yaml", alias_bomb(), "more than 100,000 values once its aliases"),
        ("deep.json", '{"a":' * 10_000 + "1" + "}" * 10_000, "nested more than 64 levels deep"),
        ("deep.yaml", "training: " + "[" * 10_000 + "]" * 10_000 + "\n", "nested more than 64 levels deep"),
        ("big.yaml", "# a data file, not a config\n" * 80_000, "larger than any launch config"),
    ],
)
def test_hostile_configs_are_refused_at_once(tmp_path, name, text, says) -> None:
    """The bomb took 41 s and 5.6 GB before a MemoryError; deep nesting was an internal RecursionError."""
    path = tmp_path / name
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        read_file(str(path))
    assert time.perf_counter() - start < 0.5
    [finding] = caught.value.findings
    assert finding.rule == "FT006" and says in finding.message
    r = runner.invoke(app, ["validate-config", str(path)])
    assert r.exit_code == 2 and "FT006" in r.output, r.output


def test_aliases_a_config_may_use_still_read(tmp_path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("launch: &l {num_processes: 2, use_cpu: true}\ntraining: {seed: 3}\nfsdp: {version: 2}\n")
    assert read_file(str(path)).format == "recipe"


def test_trust_remote_code_names_the_code_every_rank_runs(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    auto_map = {"AutoModelForCausalLM": "modeling_custom.CustomLM", "AutoTokenizer": ["other/repo--tok.Tok", None]}
    (model / "config.json").write_text(json.dumps({"model_type": "custom", "auto_map": auto_map}))
    (model / "modeling_custom.py").write_text("import os\n")
    (model / "tokenizer.json").write_text("{}")  # validate-config reads the folder as train would (PF006 without)
    flags = ["--model_name_or_path", str(model), "--trust_remote_code", "true"]
    r = runner.invoke(app, ["validate-config", BASE, *flags])
    assert r.exit_code == 0 and "FT083" in r.output, r.output
    assert "modeling_custom.py, other/repo: tok.py" in r.output and "every rank imports and runs" in r.output
    assert "FT083" not in runner.invoke(app, ["validate-config", BASE]).output
