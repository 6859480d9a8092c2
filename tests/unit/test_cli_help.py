"""A new user's first commands: `--help` lists the flags (the common ones by group, and how to see all),
`fsdp-tune flags` lists every one with its allowed values, `builtin:nope` is a config error naming the builtins,
and any command piped into `head` ends quietly with its own exit code."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.names import flag_table
from fsdp_tune.output.flags import COMMON
from fsdp_tune.sources.builtin import PRESETS
from tests.conftest import REPO

runner = CliRunner()


@pytest.mark.parametrize("command", ["train", "validate-config", "plan"])
def test_help_lists_the_common_flags_by_group_and_how_to_see_all(command: str) -> None:
    r = runner.invoke(app, [command, "--help"])
    assert r.exit_code == 0, r.output
    for group, names in COMMON.items():
        assert f"{group}:" in r.output, group
        for name in names:
            assert f"--{name}" in r.output, name
    assert "fsdp-tune flags [GROUP|WORD]" in r.output
    top = runner.invoke(app, ["--help"])
    assert "fsdp-tune flags" in top.output and "flags" in top.output


def test_the_common_flags_are_flags() -> None:
    table = flag_table()
    assert [n for names in COMMON.values() for n in names if n not in table] == []


def test_flags_lists_a_field_with_every_allowed_value() -> None:
    r = runner.invoke(app, ["flags", "lr_scheduler_type"])
    assert r.exit_code == 0, r.output
    assert "--lr_scheduler_type" in r.output and "default linear" in r.output
    for value in ("cosine", "cosine_with_restarts", "warmup_stable_decay", "constant_with_warmup"):
        assert value in r.output, value
    group = runner.invoke(app, ["flags", "lora"])
    assert "--lora_r " in group.output and "--use_rslora" in group.output and "--learning_rate" not in group.output
    every = runner.invoke(app, ["flags"])
    assert every.output.count("\n  --") >= len(flag_table()) - 5  # one line per flag (aliases share a name)
    missing = runner.invoke(app, ["flags", "no_such_thing"])
    assert missing.exit_code == 2 and "no flag matches" in missing.output


def test_an_unknown_flag_points_at_the_closest_name_or_the_flags_command() -> None:
    r = runner.invoke(app, ["validate-config", "--learnig_rate", "1e-4"])
    assert r.exit_code == 2 and "--learning_rate" in r.output
    r = runner.invoke(app, ["validate-config", "--qqqzzz", "1"])
    assert r.exit_code == 2 and "`fsdp-tune flags WORD` lists flags by name" in r.output, r.output


@pytest.mark.parametrize("command", ["validate-config", "train", "plan"])
def test_an_unknown_builtin_model_is_a_config_error_with_the_closest_name(command: str, tmp_path) -> None:
    argv = [command, "--model_name_or_path", "builtin:tiny-lama", "--dataset_name", "builtin:demo-chat"]
    r = runner.invoke(app, [*argv, "--output_dir", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    assert "FT085" in r.output and "builtin:tiny-lama is not a model fsdp-tune builds" in r.output
    assert "--model_name_or_path builtin:tiny-llama (the closest)" in r.output
    assert "internal error" not in r.output


def test_an_unknown_builtin_dataset_is_a_config_error() -> None:
    r = runner.invoke(app, ["validate-config", "--dataset_name", "builtin:demo"])
    assert r.exit_code == 2 and "FT107" in r.output and "builtin:demo-chat" in r.output, r.output


def test_the_readme_lists_every_builtin_model() -> None:
    readme = (REPO / "README.md").read_text()
    assert [name for name in PRESETS if f"builtin:{name}" not in readme] == []


@pytest.mark.parametrize(
    "argv,code",
    [
        (["rules"], 0),
        (["flags"], 0),
        (["validate-config", "--lora_r", "8"], 0),
        (["validate-config", "--lr_scheduler_type", "cosin"], 2),  # the verdict survives a closed reader
    ],
)
def test_a_reader_that_leaves_ends_nothing_badly(argv: list[str], code: int) -> None:
    """`fsdp-tune rules | head`: the reader is gone before the first write (closed at once), on stdout and
    stderr alike; the command runs on to its own exit code, with no BrokenPipeError and no exit 3."""
    read, write = os.pipe()
    os.close(read)  # the reader left before anything was written: every write fails with EPIPE
    proc = subprocess.run(
        [sys.executable, "-m", "fsdp_tune", *argv],
        stdout=write,
        stderr=write,
        cwd=REPO,
        timeout=60,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    os.close(write)
    assert proc.returncode == code
