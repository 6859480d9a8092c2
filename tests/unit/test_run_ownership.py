"""One run per output folder (#17): the run id, `latest` resuming only this run's checkpoints, the lock, the
previous run moved aside (never deleted), folders that are not a run's, manifest replays. The ranks are
stood in for (tests/unit/fake_ranks.py); the lock tests start a real launcher whose torchrun is a stub."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.runfiles import LOCK_NAME, MANIFEST_NAME
from tests.conftest import FIXTURES
from tests.unit.fake_ranks import stub_launcher

BASE = str(FIXTURES / "tiny_lora.yaml")
SAVE = ("--save_strategy", "steps", "--save_steps", "2")
runner = CliRunner()


def train(out: Path, *flags: str):
    return runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(out), *flags])


def plan(out: Path, *flags: str) -> tuple[str, object]:
    """What `train` would say and decide, without the dry run's memory plan (which imports torch)."""
    from fsdp_tune.launch.train import plan_run

    said: list[str] = []
    planned = plan_run(BASE, ["--output_dir", str(out), *flags], said.append)
    return "\n".join(said), planned


def test_overwrite_moves_the_previous_run_aside_and_latest_resumes_only_this_run(tmp_path, fake_ranks) -> None:
    """Defect 1: with --overwrite_output_dir (the demo config sets it) the previous run's complete
    checkpoints stayed, and `latest` after a preemption continued the *previous* run."""
    out = tmp_path / "o"
    fake_ranks.next(checkpoints=[2, 4])
    assert train(out, *SAVE).exit_code == 0
    first_id = json.loads((out / MANIFEST_NAME).read_text())["run_id"]

    fake_ranks.next(stop_at=2, signal_seen_by_launcher=signal.SIGTERM)  # preempted at step 2
    r = train(out, *SAVE, "--overwrite_output_dir", "true")
    assert r.exit_code == 143 and "continue with --resume_from_checkpoint latest" in r.output, r.output
    second_id = json.loads((out / MANIFEST_NAME).read_text())["run_id"]
    assert second_id != first_id and f"run id: {second_id}" in r.output
    [aside] = tmp_path.glob("o.previous-*")  # the first run, whole, beside the folder
    assert aside.name == f"o.previous-{first_id}" and "moved what" in r.output
    assert (aside / "checkpoint-4").is_dir() and json.loads((aside / MANIFEST_NAME).read_text())["run_id"] == first_id
    assert not (out / "checkpoint-4").exists()

    said, planned = plan(out, *SAVE, "--resume_from_checkpoint", "latest")
    assert f"resuming from {out / 'checkpoint-2'} (step 2, run {second_id}, the run this folder holds)" in said, said
    assert planned.run_id == second_id  # a resumed run continues its id


def test_latest_passes_over_a_checkpoint_of_another_run(tmp_path, fake_ranks) -> None:
    """A checkpoint copied in from elsewhere (or left by another run) is named and skipped, not resumed."""
    from tests.unit.fake_ranks import write_checkpoint

    out = tmp_path / "o"
    fake_ranks.next(stop_at=2, signal_seen_by_launcher=signal.SIGTERM)
    assert train(out, *SAVE).exit_code == 143
    write_checkpoint(out, 6, "20990101-000000-abcdef")
    said, _ = plan(out, *SAVE, "--resume_from_checkpoint", "latest")
    assert "skipping" in said and "checkpoint-6: it belongs to run 20990101-000000-abcdef" in said, said
    assert f"resuming from {out / 'checkpoint-2'}" in said


def test_checkpoints_copied_into_a_new_folder_continue_their_run(tmp_path) -> None:
    """No manifest names the folder's run: the checkpoint's run continues (its later checkpoints match)."""
    from tests.unit.fake_ranks import write_checkpoint

    out = tmp_path / "copy"
    write_checkpoint(out, 4, "20990101-000000-abcdef")
    said, planned = plan(out, "--resume_from_checkpoint", "latest")
    assert planned.run_id == "20990101-000000-abcdef", said
    assert "(step 4, run 20990101-000000-abcdef: no manifest here names another run, so that run continues)" in said


def test_a_second_run_into_a_live_output_dir_is_refused(tmp_path, fake_ranks) -> None:
    """Defect 2: two runs into one folder both ran (one trained the other's config; checkpoints, metrics and
    the stop file were shared)."""
    from fsdp_tune.rundir import ownership

    out = tmp_path / "o"
    first = stub_launcher(out)
    try:
        for flags in ([], ["--resume_from_checkpoint", "latest"], ["--overwrite_output_dir", "true"]):
            r = train(out, *flags)
            assert r.exit_code == 2 and "PF034" in r.output, r.output
            assert f"pid {first.pid} on" in r.output and "is in use by run" in r.output
        assert not fake_ranks.specs  # nothing was started, nothing of the first run's was touched
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
    finally:
        first.kill()
    assert first.returncode == 143
    assert ownership.holder_of(out) is None and (out / LOCK_NAME).read_text() == ""  # released, not deleted


def test_the_lock_dies_with_its_holder(tmp_path, fake_ranks) -> None:
    """A launcher killed outright (SIGKILL, OOM killer) leaves no lock behind: torchrun held it too, and
    dies with the launcher; the next run says whose lock it found."""
    from fsdp_tune.rundir import ownership

    out = tmp_path / "o"
    first = stub_launcher(out)
    first.kill()
    first.wait()
    deadline = time.monotonic() + 30
    while ownership.holder_of(out) is not None:  # torchrun gets SIGTERM when its parent dies
        assert time.monotonic() < deadline
        time.sleep(0.05)
    fake_ranks.next(checkpoints=[])
    r = train(out, "--resume_from_checkpoint", "latest")
    assert r.exit_code == 0, r.output
    assert "was last owned by run" in r.output and f"pid {first.pid}" in r.output and "no longer running" in r.output


def test_stale_record_without_flock_is_judged_by_pid(tmp_path, monkeypatch) -> None:
    """Where the file system has no flock, a record of a dead pid on this host is stale; a live one is not."""
    import errno
    import fcntl
    import socket

    from fsdp_tune.rundir import ownership

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    out = tmp_path / "o"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {"run_id": "r1", "host": socket.gethostname(), "pid": int(dead.stdout), "started": "then"}
    (out / LOCK_NAME).write_text(json.dumps(record))
    lock = ownership.acquire(out, "r2")
    assert "no longer running" in lock.note
    lock.release()
    (out / LOCK_NAME).write_text(json.dumps({**record, "pid": os.getpid()}))
    try:
        ownership.acquire(out, "r3")
    except Exception as err:  # noqa: BLE001
        assert "PF034" in str(getattr(err, "findings", [""])[0].rule)
    else:
        raise AssertionError("a live holder's record was ignored")


def test_a_folder_that_is_not_a_run_is_refused_and_kept(tmp_path, fake_ranks) -> None:
    """Defect 4: an output dir with someone's files (README.md, loss.png) was accepted and written over.
    #26: --overwrite_output_dir moved them aside; it moves a previous run only."""
    out = tmp_path / "notes"
    out.mkdir()
    (out / "README.md").write_text("mine")
    (out / "loss.png").write_bytes(b"my plot")
    flag_sets = ([], ["--overwrite_output_dir", "false"], ["--resume_from_checkpoint", "latest"])
    for flags in (*flag_sets, ["--overwrite_output_dir", "true"]):
        r = train(out, *flags)
        assert r.exit_code == 2 and "PF033" in r.output and "README.md, loss.png" in r.output, r.output
    assert not fake_ranks.specs and not list(tmp_path.glob("notes.previous-*"))
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "loss.png"]
    assert (out / "loss.png").read_bytes() == b"my plot"


def test_other_machines_rank_specs_in_flight_are_not_foreign_files(tmp_path) -> None:
    """Multi-node, shared folder: machine 1 writes its rank spec (a temporary file, then renamed) while machine 0
    looks at the folder; found mid-write, the temporary file made machine 0 refuse the folder (PF033) and left
    machine 1 waiting at the rendezvous (seen once in CI's loopback test)."""
    from fsdp_tune.rundir import outdir
    from fsdp_tune.runfiles import RESOLVED_NAME

    out = tmp_path / "run"
    out.mkdir()
    (out / f".node1-{RESOLVED_NAME}.zfbk2gag.tmp").write_text("{")
    assert outdir.inspect(out).kind == "empty"
    (out / f"node1-{RESOLVED_NAME}").write_text("{}")
    (out / "README.md").write_text("mine")
    folder = outdir.inspect(out)
    assert folder.kind == "foreign" and folder.evidence == ["README.md"]
    aside = outdir.move_aside(folder)
    assert sorted(p.name for p in out.iterdir()) == [f".node1-{RESOLVED_NAME}.zfbk2gag.tmp", f"node1-{RESOLVED_NAME}"]
    assert [p.name for p in aside.iterdir()] == ["README.md"]


def test_a_manifest_replay_needs_a_new_output_dir(tmp_path, fake_ranks) -> None:
    """Defect 4: `train --config RUN/fsdp_tune_run.json` wrote over RUN's adapter and manifest."""
    out = tmp_path / "o"
    fake_ranks.next(checkpoints=[])
    assert train(out, "--overwrite_output_dir", "true").exit_code == 0  # recorded in the manifest, as the demo's
    manifest = out / MANIFEST_NAME
    before = manifest.read_text()
    for flags in ([], ["--output_dir", str(out)]):
        r = runner.invoke(app, ["train", "--config", str(manifest), *flags])
        assert r.exit_code == 2 and "PF035" in r.output and "--output_dir o-replay" in r.output, r.output
    assert manifest.read_text() == before and len(fake_ranks.specs) == 1
    fake_ranks.next(checkpoints=[])
    r = runner.invoke(app, ["train", "--config", str(manifest), "--output_dir", str(tmp_path / "replay")])
    assert r.exit_code == 0, r.output


def test_an_output_dir_that_cannot_be_created_is_a_preflight_finding(tmp_path, fake_ranks) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = train(blocker / "run")
    assert r.exit_code == 2 and "PF032" in r.output and "is a file, not a folder" in r.output, r.output
    assert not fake_ranks.specs
