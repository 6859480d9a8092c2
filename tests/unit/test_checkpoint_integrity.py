"""A checkpoint is resumed only as it was written (#17, defect 5): its completion marker lists every file
with its size (and sha256), `latest` passes over one that lost a file, and a checkpoint named by path is
refused with the file named. Deleting scheduler.pt or optimizer_0/ used to restart the LR schedule or the
optimizer without a word (exit 0, an adapter up to 90% different)."""

from __future__ import annotations

import json
import shutil
import signal

from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.launch.checkpoints import latest_complete
from fsdp_tune.runfiles import COMPLETE_MARKER
from tests.conftest import FIXTURES
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
    from fsdp_tune.launch.checkpoints import verify, write_marker

    folder = write_checkpoint(tmp_path, 3, "r1")
    assert verify(folder) is None
    shard = folder / "pytorch_model_fsdp_0" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    assert verify(folder) == "pytorch_model_fsdp_0/__1_0.distcp is 100 bytes, 2000 when written (cut short or replaced)"
    write_marker(folder, 3, "r1")
    (folder / "scheduler.pt").write_bytes(b"\0" * 100)  # same size, other bytes
    assert verify(folder) == "scheduler.pt changed since it was written (sha256 differs)"
    (folder / "pytorch_model_fsdp_0" / ".metadata").unlink()
    assert verify(folder) == "pytorch_model_fsdp_0/.metadata is missing (listed in its completion marker)"


def test_unmarked_and_earlier_fsdp_tune_checkpoints(tmp_path) -> None:
    """One being written when the run stopped is skipped; an earlier fsdp-tune's marker (no file list) is
    trusted as before; a plain Trainer run (no markers at all) falls back to trainer_state.json."""
    write_checkpoint(tmp_path, 2, None, marked=False)
    (tmp_path / "checkpoint-2" / COMPLETE_MARKER).write_text(json.dumps({"global_step": 2}))  # earlier fsdp-tune
    write_checkpoint(tmp_path, 4, "r1", marked=False)
    best, skipped = latest_complete(tmp_path)
    assert best is not None and best.step == 2 and [c.step for c in skipped] == [4]
    plain = tmp_path / "plain"
    write_checkpoint(plain, 6, None, marked=False)
    assert latest_complete(plain)[0].step == 6
