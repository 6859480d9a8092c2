"""`plan` and `--emit` find what `train` finds (#48), as a user runs them: a model in the Hugging Face cache by its
hub id, laid out as `hf download` leaves it (models--org--name/refs/main, snapshots/<commit>/config.json), and a
plan for several machines that asks for no address (a plan is not a launch), so the `--num_machines` option plan
itself lists plans when pasted. The plans build the model on the meta device (torch): this layer."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from tests.conftest import hub_snapshot

runner = CliRunner()
REPO_ID = "acme/tiny-chat"
TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def _hf_cache(tmp_path, monkeypatch) -> None:
    """HF_HOME with the model as `hf download acme/tiny-chat --include config.json` leaves it."""
    home = tmp_path / "hf"
    snapshot = hub_snapshot(home / "hub", REPO_ID, "0123456789abcdef0123456789abcdef01234567")
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(TINY))
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_plan_finds_a_model_in_the_hf_cache_by_its_hub_id(tmp_path, monkeypatch) -> None:
    _hf_cache(tmp_path, monkeypatch)
    r = runner.invoke(app, ["plan", "--model_name_or_path", REPO_ID, "--use_peft_lora", "true", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["model"]["layers"] == 2 and "Hugging Face cache" in plan["model"]["source"], plan["model"]


def test_emit_finds_a_model_in_the_hf_cache_by_its_hub_id(tmp_path, monkeypatch) -> None:
    _hf_cache(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "job.sbatch"
    args = ["train", "--model_name_or_path", REPO_ID, "--dataset_name", "builtin:demo-chat", "--use_peft_lora", "true"]
    r = runner.invoke(app, [*args, "--num_processes", "16", "--num_machines", "2", "--emit", "slurm", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert f"--model_name_or_path {REPO_ID}" in out.read_text()


def test_the_num_machines_option_plan_lists_plans_when_pasted() -> None:
    """70B LoRA on 8 x H100 does not fit; plan lists more machines among what fits. Pasted after the same
    command, that option plans (it was refused: FT092, several machines need --main_process_ip)."""
    command = ["plan", "--model_name_or_path", "meta-llama/Llama-2-70b-hf", "--num_processes", "8"]
    command += ["--use_peft_lora", "true", "--gpu", "h100", "--json"]
    r = runner.invoke(app, command)
    options = [o["flags"] for o in json.loads(r.output)["advice"] if "--num_machines" in o["flags"]]
    assert options, r.output
    pasted = runner.invoke(app, [*command, *options[0].split()])
    assert pasted.exit_code == 0, pasted.output
    assert json.loads(pasted.output)["fits"]
    launch = runner.invoke(app, ["validate-config", *command[1:-3], *options[0].split()])
    assert launch.exit_code == 2 and "FT092" in launch.output  # a launch still needs machine 0's address


def test_the_plan_measures_the_revision_train_decides(tmp_path, monkeypatch) -> None:
    """The planner reads the model's facts as decided (one key: the name and --model_revision, #47), not its own
    lookup by name: with refs/main at a 2-layer commit and --model_revision naming a 3-layer one, every part of the
    plan (the check, the shape, the attention the stack assumes) reads the 3-layer config."""
    _hf_cache(tmp_path, monkeypatch)
    other = "fedcba9876543210fedcba9876543210fedcba98"
    snapshot = tmp_path / "hf" / "hub" / f"models--{REPO_ID.replace('/', '--')}" / "snapshots" / other
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({**TINY, "num_hidden_layers": 3}))
    args = ["plan", "--model_name_or_path", REPO_ID, "--use_peft_lora", "true", "--json"]
    main = json.loads(runner.invoke(app, args).output)
    r = runner.invoke(app, [*args, "--model_revision", other])
    assert r.exit_code == 0, r.output
    assert (main["model"]["layers"], json.loads(r.output)["model"]["layers"]) == (2, 3)
