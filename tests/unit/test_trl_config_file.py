"""TRL's own config file (#48): the flat YAML `trl sft --config sft.yaml` takes (ScriptArguments, ModelConfig and
SFTConfig fields in one mapping, trl/scripts/utils.py TrlParser) is read as `train`'s flags: each key reaches the
rank spec, is refused with a rule id (`env:`, FT017) or dropped with a warning naming it (ignore_bias_buffers); a
Hub dataset not on this machine is refused before anything starts, with the download that fixes it."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.readers import TRL, read_file

TRL_YAML = """\
# trl sft --config sft.yaml
model_name_or_path: builtin:tiny-llama
dataset_name: {data}
use_peft: true
lora_r: 8
lora_alpha: 16
lora_target_modules: [q_proj, v_proj]
learning_rate: 1.0e-4
max_steps: 3
per_device_train_batch_size: 2
max_length: 64
output_dir: {out}
report_to: none
"""


def _files(tmp_path, extra: str = "") -> str:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"count to {i}", "completion": f" {i}"}) + "\n" for i in range(20)))
    path = tmp_path / "sft.yaml"
    path.write_text(TRL_YAML.format(data=data, out=tmp_path / "out") + extra)
    return str(path)


def test_a_flat_trl_yaml_is_valid_and_every_key_reaches_the_rank_spec(tmp_path) -> None:
    config = _files(tmp_path)
    assert read_file(config).format == TRL
    r = CliRunner().invoke(app, ["validate-config", config])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["train", "--config", config, "--dry_run", "--json"])
    assert r.exit_code == 0, r.output
    spec = json.loads(r.output)["spec"]
    assert (spec["lora"]["r"], spec["lora"]["lora_alpha"], spec["lora"]["target_modules"]) == (
        8,
        16.0,
        ["q_proj", "v_proj"],
    )
    assert spec["lora"]["lora_dropout"] == 0.05  # TRL's default for what the file leaves unset (FT015)
    given = spec["trainer_args"]["trl_args"]  # the settings fsdp-tune does not decide, by TRL's names
    assert given["learning_rate"] == 1e-4 and given["max_steps"] == 3
    assert spec["data"]["max_seq_len"] == 64 and spec["data"]["dataset_name"].endswith("data.jsonl")
    assert spec["model"]["requested"] == "builtin:tiny-llama"
    assert spec["trainer_args"]["output_dir"] == str(tmp_path / "out")


def test_flags_win_over_the_trl_file(tmp_path) -> None:
    r = CliRunner().invoke(app, ["train", "--config", _files(tmp_path), "--lora_r", "4", "--dry_run", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["spec"]["lora"]["r"] == 4


def test_env_is_refused_and_ignore_bias_buffers_dropped_each_by_name(tmp_path) -> None:
    config = _files(tmp_path, "ignore_bias_buffers: true\nenv:\n  WANDB_PROJECT: mine\n  HF_TOKEN: hf_secret\n")
    r = CliRunner().invoke(app, ["validate-config", config])
    assert r.exit_code == 2, r.output
    assert "FT017 env (" in r.output and "WANDB_PROJECT, HF_TOKEN" in r.output and "export NAME=value" in r.output
    assert "hf_secret" not in r.output  # names only: a value may be a token
    assert "FT017 ignore_bias_buffers" in r.output and "ignored" in r.output


def test_an_unknown_key_in_a_trl_file_names_the_closest(tmp_path) -> None:
    r = CliRunner().invoke(app, ["validate-config", _files(tmp_path, "learning_rat: 0.1\n")])
    assert r.exit_code == 2 and "FT001 learning_rat" in r.output and "learning_rate" in r.output, r.output


def test_sftconfigs_fsdp_config_in_a_trl_file_is_read_as_fsdp_settings(tmp_path) -> None:
    config = _files(tmp_path, "fsdp: full_shard auto_wrap\nfsdp_config:\n  reshard_after_forward: false\n")
    assert read_file(config).format == TRL
    r = CliRunner().invoke(app, ["train", "--config", config, "--dry_run", "--json"])
    assert r.exit_code == 0, r.output
    assert '"reshard_after_forward": false' in json.dumps(json.loads(r.output)["spec"]["trainer_args"])


def test_distributed_type_still_marks_an_accelerate_yaml(tmp_path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("learning_rate: 0.1\nfsdp_config: {}\ndistributed_type: FSDP\n")
    assert read_file(str(path)).format == "accelerate"  # distributed_type decides before any TRL name


def test_a_hub_dataset_not_on_this_machine_is_refused_with_the_download(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    config = _files(tmp_path)
    text = (tmp_path / "sft.yaml").read_text().replace(str(tmp_path / "data.jsonl"), "trl-lib/Capybara")
    (tmp_path / "sft.yaml").write_text(text)
    r = CliRunner().invoke(app, ["train", "--config", config])
    assert r.exit_code == 2, r.output
    assert "PF015" in r.output and "trl-lib/Capybara is a Hub dataset that is not in this machine's cache" in r.output
    assert "hf download trl-lib/Capybara --repo-type dataset" in r.output


def test_a_recipe_section_beside_flat_keys_says_how_to_fix_it(tmp_path) -> None:
    path = tmp_path / "mixed.yaml"
    path.write_text("learning_rate: 0.001\ntraining:\n  max_steps: 3\n")
    r = CliRunner().invoke(app, ["validate-config", str(path)])
    assert r.exit_code == 2 and "FT001 training" in r.output and "move the top-level keys into `training:`" in r.output


def test_a_hub_dataset_with_the_hub_not_answering_is_refused_too(tmp_path, monkeypatch) -> None:
    """Not offline by the environment, but no Hub: refused before launch (rank 0 would retry, then a traceback)."""
    from fsdp_tune.preflight import reach
    from fsdp_tune.preflight.data import settle
    from fsdp_tune.sources.mixture import Source

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    asked = []
    monkeypatch.setattr(reach, "unreachable", lambda url: asked.append(url) or "no answer within 3 s")
    _, _, (finding,) = settle((Source("trl-lib/Capybara"),), "text", None, False)
    assert finding.rule == "PF015" and "cannot be reached: no answer within 3 s" in finding.message
    assert asked == ["https://huggingface.co/api/datasets/trl-lib/Capybara"]
    monkeypatch.setattr(reach, "unreachable", lambda url: None)  # the Hub answers: rank 0 downloads it
    assert settle((Source("trl-lib/Capybara"),), "text", None, False)[2] == []
