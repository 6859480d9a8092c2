"""The commands after a run, up to where they would load a model: chat's prompts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.errors import UsageError
from fsdp_tune.tools.chat import prompts_from

runner = CliRunner()


def test_prompts_come_from_flags_then_the_file(tmp_path) -> None:
    file = tmp_path / "prompts.txt"
    file.write_text("Count from 1 to 8.\n\n  Spell the word engine backwards.  \n")
    assert prompts_from(["Hi"], str(file)) == ["Hi", "Count from 1 to 8.", "Spell the word engine backwards."]
    assert prompts_from([], None) == []
    with pytest.raises(UsageError, match="cannot be read"):
        prompts_from([], str(tmp_path / "missing.txt"))


def test_chat_needs_a_run_folder(tmp_path) -> None:
    r = runner.invoke(app, ["chat", str(tmp_path), "--prompt", "Hi"])
    assert r.exit_code == 2 and "no adapter_config.json" in r.output
