"""Writes stay inside the run's folder, and --overwrite_output_dir moves a previous run only (#26 items 2, 4).

Planted links (`fsdp_tune.lock`, `logs/rank-0.log` pointing elsewhere) made a run truncate and append to
files outside its folder, and such a folder counted as empty; `train --output_dir .` with the demo recipe
(which sets --overwrite_output_dir) moved `.git` and the sources aside. The ranks are stood in for."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.rundir import outdir, ownership
from fsdp_tune.runfiles import MANIFEST_NAME, open_nofollow
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")
runner = CliRunner()


def train(out: Path | str, *flags: str):
    return runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(out), *flags])


@pytest.fixture(autouse=True)
def _no_memory_plan(monkeypatch) -> None:
    """The dry run's memory plan imports torch; what the dry run says about the folder is the point here."""
    monkeypatch.setattr("fsdp_tune.cli.run_cmds._dry_run_memory", lambda cfg, loading: None)


@pytest.mark.parametrize("rel", ["fsdp_tune.lock", "logs/rank-0.log", "logs", "metrics.jsonl"])
def test_a_planted_link_is_refused_and_nothing_is_written_through_it(tmp_path, fake_ranks, rel) -> None:  # noqa: F811
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "rank-0.log").write_text("precious")
    (victim / "precious.txt").write_text("precious")
    out = tmp_path / "o"
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    (out / rel).symlink_to(victim if rel == "logs" else victim / "precious.txt")
    assert outdir.inspect(out).kind != "empty"  # a folder with links in it is not empty
    for flags in ([], ["--overwrite_output_dir", "true"], ["--dry_run"]):
        r = train(out, *flags)
        assert r.exit_code == 2 and "PF061" in r.output, r.output  # a dry run too: it could not start
        assert f"{rel} -> {victim}" in r.output.replace("\n", ""), r.output
    assert not fake_ranks.specs and not (out / MANIFEST_NAME).exists()
    assert [(victim / n).read_text() for n in ("rank-0.log", "precious.txt")] == ["precious"] * 2


def test_run_files_are_opened_without_following_links(tmp_path) -> None:
    """What the pre-flight cannot see (a link planted while the run runs): the lock, a rank's log and
    metrics.jsonl are opened with O_NOFOLLOW below the output folder."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "o"
    out.mkdir()
    (out / "fsdp_tune.lock").symlink_to(victim)
    with pytest.raises(OSError) as lock:
        ownership.acquire(out, "r1")
    (out / "logs").symlink_to(tmp_path)
    with pytest.raises(OSError) as log:
        open_nofollow(out, "logs/rank-0.log")
    (out / "metrics.jsonl").symlink_to(victim)
    with pytest.raises(OSError) as metrics:
        open_nofollow(out, "metrics.jsonl")
    assert {e.value.errno for e in (lock, log, metrics)} == {errno.ELOOP}
    assert victim.read_text() == "precious" and not (tmp_path / "rank-0.log").exists()
    os.close(open_nofollow(tmp_path / "fresh", "logs/rank-1.log"))  # plain folders are created as before
    assert (tmp_path / "fresh" / "logs" / "rank-1.log").is_file()


def _place(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A folder --overwrite_output_dir must never empty, and how the refusal names it."""
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "fsdp_tune_run.json").write_text("{}")  # looks like a run, too
    if kind == "checkout":
        subprocess.run(["git", "init", "-q", str(folder)], check=True)
        return folder, "PF062"
    if kind == "notes-beside-a-run":
        (folder / "my_notes.txt").write_text("mine")
        return folder, "PF033"
    return folder, "PF062"


@pytest.mark.parametrize("kind", ["checkout", "notes-beside-a-run", "cwd", "home"])
def test_overwrite_never_moves_what_is_not_a_run(tmp_path, fake_ranks, monkeypatch, kind) -> None:  # noqa: F811
    folder, rule = _place(tmp_path, kind)
    out: Path | str = folder
    if kind == "cwd":
        monkeypatch.chdir(folder)
        out = "."
    if kind == "home":
        monkeypatch.setenv("HOME", str(folder))
    before = sorted(p.name for p in folder.iterdir())
    for flags in (["--overwrite_output_dir", "true"], ["--overwrite_output_dir", "true", "--dry_run"]):
        r = train(out, *flags)
        assert rule in r.output and r.exit_code == 2, r.output  # a dry run too: it could not start
    assert "moves aside a previous run only" in r.output or "it is " in r.output, r.output
    assert sorted(p.name for p in folder.iterdir()) == before and not list(tmp_path.glob("*.previous-*"))
    assert not fake_ranks.specs


def test_overwrite_still_moves_a_previous_run_whole(tmp_path, fake_ranks) -> None:
    out = tmp_path / "o"
    fake_ranks.next(checkpoints=[2])
    assert train(out, "--save_strategy", "steps", "--save_steps", "2").exit_code == 0
    (out / "README.md").write_text("PEFT's model card")  # a run's own files, whatever wrote them
    fake_ranks.next(checkpoints=[])
    r = train(out, "--overwrite_output_dir", "true")
    assert r.exit_code == 0, r.output
    [aside] = tmp_path.glob("o.previous-*")
    assert (aside / "checkpoint-2").is_dir() and (aside / "README.md").exists()
