"""Secrets never reach a file or the console (#26 item 3): `--hub_token` was written in plain text into
fsdp_tune_run.json (command line and resolved config) and fsdp_tune_resolved.json. Now the token reaches the
ranks as HF_TOKEN in their environment only; files and output show <redacted>. The ranks are stood in for."""

from __future__ import annotations

import json
import sys

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.redact import is_secret_key, redact, redact_argv
from fsdp_tune.rundir import ownership
from fsdp_tune.runfiles import LOCK_NAME, MANIFEST_NAME
from tests.conftest import FIXTURES

BASE = FIXTURES / "tiny_lora.yaml"
TOKEN = "hf_" + "aB3dE6gH9" * 4
runner = CliRunner()


def _everything_written(folder) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())


def test_a_hub_token_reaches_the_ranks_environment_and_no_file(tmp_path, fake_ranks, monkeypatch) -> None:  # noqa: F811
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(BASE.read_text() + f"  hub_token: {TOKEN}\n")
    for config, flags in ((BASE, ["--hub_token", TOKEN]), (recipe, []), (BASE, [f"--hub_token={TOKEN}"])):
        out = tmp_path / f"o{len(fake_ranks.specs)}"
        argv = ["train", "--config", str(config), "--output_dir", str(out), *flags]
        monkeypatch.setattr(sys, "argv", ["fsdp-tune", *argv])  # what the manifest records
        r = runner.invoke(app, argv)
        assert r.exit_code == 0, r.output
        assert fake_ranks.secret_envs[-1] == {"HF_TOKEN": TOKEN}  # the push still has its token
        assert "hub_token" not in fake_ranks.specs[-1].trainer_args.kwargs()
        assert TOKEN not in _everything_written(out) and TOKEN not in r.output
        manifest = json.loads((out / MANIFEST_NAME).read_text())
        assert "hub_token" not in manifest["resolved_config"].get("training", {})  # a replay takes HF_TOKEN
        if flags:
            assert "<redacted>" in " ".join(manifest["command"]), manifest["command"]
    for extra in ([], ["--json"]):
        r = runner.invoke(app, ["validate-config", str(BASE), "--hub_token", TOKEN, *extra])
        assert TOKEN not in r.output and "<redacted>" in r.output, r.output


def test_the_lock_record_hides_the_token(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["fsdp-tune", "train", "--hub_token", TOKEN, "--output_dir", str(tmp_path)])
    lock = ownership.acquire(tmp_path, "r1")
    try:
        record = (tmp_path / LOCK_NAME).read_text()
    finally:
        lock.release()
    assert TOKEN not in record and "--hub_token <redacted>" in record


def test_what_counts_as_a_secret() -> None:
    assert all(map(is_secret_key, ["hub_token", "--hub_token", "training.hub_token", "wandb_api_key", "password"]))
    assert not any(
        map(is_secret_key, ["pad_token", "eos_token", "add_special_tokens", "max_tokens", "trainable_token_indices"])
    )
    assert redact({"pad_token": "<pad>", "run_name": f"x-{TOKEN}", "client_secret": "s3"}) == {
        "pad_token": "<pad>",
        "run_name": "x-<redacted>",
        "client_secret": "<redacted>",
    }
    argv = ["train", "--hub_token", "abc", "--api_key=xyz", "--run_name", "r", TOKEN]
    assert redact_argv(argv) == [
        "train",
        "--hub_token",
        "<redacted>",
        "--api_key=<redacted>",
        "--run_name",
        "r",
        "<redacted>",
    ]
