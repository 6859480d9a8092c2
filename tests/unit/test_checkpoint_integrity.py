"""A checkpoint is resumed only as it was written (#17, defect 5): its completion marker lists every file
with its size (and sha256), `latest` passes over one that lost a file, and a checkpoint named by path is
refused with the file named. Deleting scheduler.pt or optimizer_0/ used to restart the LR schedule or the
optimizer without a word (exit 0, an adapter up to 90% different)."""

from __future__ import annotations

import json
import pickle
import shutil
import signal
import subprocess
import sys
import zipfile

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.rundir.checkpoints import latest_complete, write_marker
from fsdp_tune.rundir.pickles import check_checkpoint
from fsdp_tune.runfiles import COMPLETE_MARKER
from tests.conftest import FIXTURES
from tests.unit.fake_checkpoint import RunsCommand, archive, write_dcp
from tests.unit.fake_ranks import write_checkpoint

BASE = str(FIXTURES / "tiny_lora.yaml")
runner = CliRunner()


def train(out, *flags: str):
    return runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(out), *flags])


def resume_latest(out) -> tuple[str, str | None]:
    from fsdp_tune.launch.train import plan_run

    said: list[str] = []
    planned = plan_run(BASE, ["--output_dir", str(out), "--resume_from_checkpoint", "latest"], said.append)
    return "\n".join(said), planned.spec.resume_from_checkpoint


def test_a_checkpoint_that_lost_a_file_is_not_resumed(tmp_path, fake_ranks) -> None:
    out = tmp_path / "o"
    fake_ranks.next(checkpoints=[2], stop_at=4, signal_seen_by_launcher=signal.SIGTERM)
    assert train(out, "--save_strategy", "steps", "--save_steps", "2").exit_code == 143
    marker = json.loads((out / "checkpoint-4" / COMPLETE_MARKER).read_text())
    assert {"scheduler.pt", "optimizer_0/.metadata", "rng_state_1.pth"} <= set(marker["files"])

    (out / "checkpoint-4" / "scheduler.pt").unlink()
    said, resumed = resume_latest(out)
    assert f"skipping {out / 'checkpoint-4'}: scheduler.pt is missing" in said, said
    assert resumed == str((out / "checkpoint-2").resolve())

    r = train(out, "--resume_from_checkpoint", str(out / "checkpoint-4"))  # named by path: refused
    assert r.exit_code == 2 and "PF036" in r.output and "scheduler.pt is missing" in r.output, r.output

    shutil.rmtree(out / "checkpoint-2" / "optimizer_0")  # no intact checkpoint left: refused, not step 0
    r = train(out, "--resume_from_checkpoint", "latest")
    assert r.exit_code == 2 and "PF036" in r.output and "optimizer_0/ is missing" in r.output, r.output
    assert len(fake_ranks.specs) == 1


def test_a_shard_cut_short_or_changed_is_named(tmp_path) -> None:
    from fsdp_tune.rundir.checkpoints import verify, write_marker

    folder = write_checkpoint(tmp_path, 3, "r1")
    assert verify(folder) is None
    shard = folder / "pytorch_model_fsdp_0" / "__1_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[:100])
    assert (
        verify(folder) == f"pytorch_model_fsdp_0/__1_0.distcp is 100 bytes, {size} when written (cut short or replaced)"
    )
    write_marker(folder, 3, "r1")
    scheduler = folder / "scheduler.pt"
    scheduler.write_bytes(b"\0" * scheduler.stat().st_size)  # same size, other bytes
    assert verify(folder) == "scheduler.pt changed since it was written (sha256 differs)"
    (folder / "pytorch_model_fsdp_0" / ".metadata").unlink()
    assert verify(folder) == "pytorch_model_fsdp_0/.metadata is missing (listed in its completion marker)"


def test_unmarked_and_earlier_fsdp_tune_checkpoints(tmp_path) -> None:
    """One being written when the run stopped is skipped; a marker that lists no files (an earlier fsdp-tune's,
    or one written by hand) vouches for nothing and is skipped too (#26); a plain Trainer run (no markers at
    all) falls back to trainer_state.json."""
    write_checkpoint(tmp_path, 2, None)
    write_checkpoint(tmp_path, 4, None, marked=False)
    (tmp_path / "checkpoint-4" / COMPLETE_MARKER).write_text(json.dumps({"global_step": 4}))  # no `files`
    write_checkpoint(tmp_path, 6, "r1", marked=False)
    best, skipped = latest_complete(tmp_path)
    assert best is not None and best.step == 2 and [c.step for c in skipped] == [6, 4]
    assert "lists no files" in (skipped[1].problem or "")
    plain = tmp_path / "plain"
    write_checkpoint(plain, 6, None, marked=False)
    assert latest_complete(plain)[0].step == 6


PAYLOADS = {  # where a crafted checkpoint hides the pickle that runs a command
    "pytorch_model_fsdp_0/.metadata": "dcp metadata",  # DCP: pickle.load
    "optimizer_0/__1_0.distcp": "dcp item",  # DCP: torch.load(weights_only=False) of a non-tensor item
    "rng_state_1.pth": "archive",  # Trainer: torch.load(weights_only=True), checked all the same
    "scheduler.pt": "plain",  # torch.load reads a plain pickle too
    "optimizer.pt": "plain",  # any other torch file a Trainer or accelerate version may load
}


def _plant(folder, rel: str, payload: bytes) -> None:
    kind = PAYLOADS[rel]
    if kind == "dcp item":
        write_dcp(folder / "optimizer_0", 2, 4, item=payload)
    else:
        (folder / rel).write_bytes(archive(payload) if kind == "archive" else payload)
    write_marker(folder, 4, None)  # the attacker rewrites the marker to match: it proves nothing


@pytest.mark.parametrize("rel", list(PAYLOADS))
def test_a_crafted_checkpoint_runs_no_code_and_is_refused(tmp_path, fake_ranks, rel) -> None:  # noqa: F811
    """#26: DCP reads .metadata with pickle.load; a checkpoint whose pickle runs a command (its marker updated
    to match) resumed with exit 0 and the command ran. Now every pickle a resume loads is read by an
    unpickler that calls nothing, before any rank starts: PF060 names the file and what it would call."""
    pwned = tmp_path / "pwned"
    payload = pickle.dumps(RunsCommand(f"touch {pwned}"), protocol=2)
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"], input=payload)
    assert pwned.exists(), "the payload is live: plain pickle runs it"
    pwned.unlink()
    out = tmp_path / "o"
    folder = write_checkpoint(out, 4, None)
    assert check_checkpoint(folder) is None
    _plant(folder, rel, payload)
    r = train(out, "--resume_from_checkpoint", "latest")
    assert r.exit_code == 2 and "PF060" in r.output and "posix.system" in r.output, r.output
    assert str(folder / rel) in r.output.replace("\n", ""), r.output
    r = train(out, "--resume_from_checkpoint", str(folder))  # named by path: the same
    assert r.exit_code == 2 and "PF060" in r.output, r.output
    assert not pwned.exists() and fake_ranks.specs == []


def test_what_a_checkpoint_may_not_hold(tmp_path) -> None:
    """The other ways out of the check: an item outside its folder, a link, TorchScript in an archive."""
    folder = write_checkpoint(tmp_path, 4, None)
    meta = folder / "optimizer_0" / ".metadata"
    meta.write_bytes(meta.read_bytes().replace(b"__1_0.distcp", b"../../x.dcp!"))
    assert "outside its folder" in check_checkpoint(folder).what
    folder = write_checkpoint(tmp_path / "b", 4, None)
    (folder / "scheduler.pt").unlink()
    (folder / "scheduler.pt").symlink_to(tmp_path / "b" / "checkpoint-4" / "rng_state_0.pth")
    assert "link" in check_checkpoint(folder).what
    folder = write_checkpoint(tmp_path / "c", 4, None)
    (folder / "scheduler.pt").write_bytes(archive(pickle.dumps({}, protocol=2)) + b"")
    with zipfile.ZipFile(folder / "scheduler.pt", "a") as z:
        z.writestr("archive/constants.pkl", pickle.dumps(1))
    assert "other members (archive/constants.pkl)" in check_checkpoint(folder).what


def test_training_args_is_not_read_because_no_resume_loads_it(tmp_path) -> None:
    """transformers 4 wrote training_args.bin (a pickle of TrainingArguments) into every checkpoint; no resume
    loads it (transformers 5.24, accelerate 1.15), so it is not refused. The same pickle elsewhere is."""
    args = b"\x80\x02ctransformers.training_args\nTrainingArguments\nq\x00)\x81q\x01."  # NEWOBJ of that class
    folder = write_checkpoint(tmp_path, 4, None)
    (folder / "training_args.bin").write_bytes(args)
    assert check_checkpoint(folder) is None
    (folder / "optimizer.pt").write_bytes(args)
    assert "transformers.training_args.TrainingArguments" in check_checkpoint(folder).what


def test_an_elastic_restart_checks_the_checkpoint_it_resumes(tmp_path, fake_ranks) -> None:
    """#26: after an elastic restart (torchrun --max_restarts) each rank picks the newest checkpoint itself,
    one the launcher never checked (written, or planted, after launch). It is held to the launcher's check:
    refused with PF060, not loaded and not passed over for an older one."""
    from fsdp_tune.rundir.checkpoints import restart_checkpoint
    from fsdp_tune.rundir.pickles import Unsafe

    out = tmp_path / "o"
    older = write_checkpoint(out, 2, None)
    newest = write_checkpoint(out, 4, None)
    assert restart_checkpoint(out) == str(newest)
    pwned = tmp_path / "pwned"
    _plant(newest, "pytorch_model_fsdp_0/.metadata", pickle.dumps(RunsCommand(f"touch {pwned}"), protocol=2))
    with pytest.raises(Unsafe) as err:
        restart_checkpoint(out)
    assert "PF060" in str(err.value) and "posix.system" in str(err.value) and str(newest) in str(err.value)
    assert not pwned.exists() and older.is_dir()
