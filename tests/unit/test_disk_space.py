"""The disk under a run (#17, defect 6): free space checked against the checkpoints the run keeps (PF037),
and a full disk that cannot hide how a run ended."""

from __future__ import annotations

import errno
from collections import namedtuple

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")
runner = CliRunner()


Usage = namedtuple("Usage", "total used free")


def test_free_disk_space_is_checked_against_the_checkpoints(tmp_path, monkeypatch) -> None:
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.preflight import disk

    def findings(free: int, *flags: str) -> list:
        monkeypatch.setattr(disk.shutil, "disk_usage", lambda path: Usage(free * 4, free * 3, free))
        out = ["--output_dir", str(tmp_path / "o"), "--save_strategy", "steps", "--save_steps", "2", *flags]
        return [f for f in plan_run(BASE, out, lambda m: None).machine_findings if f.rule == "PF037"]

    assert findings(10 * 2**30) == []
    [short] = findings(2**10)  # 1 KiB: not even one checkpoint of the tiny model's adapter
    assert short.severity.value == "error" and "has 0.0 MiB free, less than one checkpoint" in short.message
    [tight] = findings(3 * 2**19)  # room for one of the 3 checkpoints (max_steps 6 / save_steps 2), not all
    assert tight.severity.value == "warning" and "the 3 checkpoints the run keeps" in tight.message
    assert findings(3 * 2**19, "--save_total_limit", "1") == []


def test_a_full_disk_does_not_replace_the_failure_report(tmp_path, fake_ranks, monkeypatch) -> None:
    """The manifest's own OSError at the end used to replace the report of the failed run."""
    from fsdp_tune.rundir import manifest

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    fake_ranks.next(returncode=1)
    monkeypatch.setattr(manifest, "write_end", full)
    r = runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o")])
    assert r.exit_code == 1 and "training failed (torchrun exit code 1)" in r.output, r.output
    assert "could not record the end of the run in fsdp_tune_run.json: [Errno 28]" in r.output

    monkeypatch.setattr(manifest, "write_start", full)  # at the start it is a pre-flight refusal, not exit 3
    r = runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "p")])
    assert r.exit_code == 2 and "PF032" in r.output and "No space left on device" in r.output, r.output
