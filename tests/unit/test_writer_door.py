"""The writer door and the run folder's readers (#46): a file written outside a run folder (`--emit -o`, `report -o`,
`convert -o`) replaces an existing one only with --force, never writes through a link, is written whole; report's
RUN/loss.png replaces a planted link instead of writing through it; report reads a run folder bounded (a FIFO, a
link to /dev/zero, a bad line: exit 2 naming the file, in bounded time). And the small ones: `--output_dir /` is
refused before anything walks it, a recipe's `output_dir: ~/x` is expanded once, a token-like run name is refused."""

from __future__ import annotations

import json
import os
import signal
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.errors import UsageError
from fsdp_tune.output.files import write_out
from fsdp_tune.runfiles import Unreadable, read_bounded
from tests.conftest import FIXTURES
from tests.unit.test_console_door import HOSTILE, OBEYED, _cli

BASE = str(FIXTURES / "tiny_lora.yaml")
runner = CliRunner()


@contextmanager
def within(seconds: float):
    """Fail, rather than hang the suite, if the body blocks (a FIFO opened for reading waits for a writer)."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


# --- the writer door itself --------------------------------------------------------------------------------------


def test_a_new_file_is_written_whole_with_the_umask_mode(tmp_path) -> None:
    out = write_out(tmp_path / "job.sh", "#!/bin/bash\n", force=False)
    assert out.read_text() == "#!/bin/bash\n"
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["job.sh"]  # no temporary file left


def test_an_existing_file_needs_force_and_keeps_its_mode(tmp_path) -> None:
    target = _victim(tmp_path)
    target.chmod(0o750)
    with pytest.raises(UsageError, match="exists; not overwritten") as refused:
        write_out(target, "new", force=False)
    assert "--force" in refused.value.hint and target.read_text() == "precious\n"
    write_out(target, "new", force=True)
    assert target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o750


def test_a_link_is_never_written_through(tmp_path) -> None:
    victim = _victim(tmp_path)
    link = tmp_path / "out.sh"
    link.symlink_to(victim)
    with pytest.raises(UsageError, match="a link to"):
        write_out(link, "payload", force=False)
    assert victim.read_text() == "precious\n" and link.is_symlink()
    write_out(link, "payload", force=True)  # --force: the link itself is replaced, its target left as it was
    assert not link.is_symlink() and link.read_text() == "payload" and victim.read_text() == "precious\n"
    dangling = tmp_path / "dangling.sh"
    dangling.symlink_to(tmp_path / "nowhere" / "created")
    with pytest.raises(UsageError):
        write_out(dangling, "payload", force=False)
    assert not (tmp_path / "nowhere").exists()


def test_a_fifo_a_folder_and_a_missing_folder_are_refused_even_with_force(tmp_path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with within(10), pytest.raises(UsageError, match="not a regular file"):
        write_out(fifo, "x", force=True)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    with pytest.raises(UsageError, match="is a folder"):
        write_out(tmp_path, "x", force=True)
    with pytest.raises(UsageError, match="there is no folder"):
        write_out(tmp_path / "no" / "job.sh", "x", force=True)


# --- each command that writes outside a run folder ---------------------------------------------------------------


def _emit(*extra: str) -> list[str]:
    return ["train", BASE, "--output_dir", "/shared/runs/x", "--emit", "slurm", *extra]


def test_emit_o_refuses_an_existing_file_and_a_link(tmp_path, monkeypatch) -> None:
    """The write of `--emit -o` (the job's planning and rendering are tests/lib/test_emit_seed.py's: the builtin
    model is built with torch): stood in for, so this is the write alone."""
    from types import SimpleNamespace

    from fsdp_tune.launch import emit
    from fsdp_tune.schedulers.emitters import EMITTERS

    decided = SimpleNamespace(nodes=2, procs_per_node=8, gpu=True)
    monkeypatch.setattr(emit, "emit", lambda *a, **k: decided)
    monkeypatch.setitem(EMITTERS, "slurm", SimpleNamespace(title="SLURM", render=lambda d: "#!/bin/bash\n"))
    victim = _victim(tmp_path)
    r = runner.invoke(app, _emit("-o", str(victim)))
    assert r.exit_code == 2 and "exists; not overwritten" in r.output and victim.read_text() == "precious\n"
    link = tmp_path / "job.sbatch"
    link.symlink_to(victim)
    r = runner.invoke(app, _emit("-o", str(link)))
    assert r.exit_code == 2 and "a link to" in r.output and victim.read_text() == "precious\n"
    r = runner.invoke(app, _emit("-o", str(link), "--force"))
    assert r.exit_code == 0, r.output
    assert not link.is_symlink() and link.read_text().startswith("#!") and victim.read_text() == "precious\n"


def _run(tmp_path: Path, name: str = "run", lines: list[str] | None = None) -> Path:
    run = tmp_path / name
    run.mkdir()
    rows = lines if lines is not None else [json.dumps({"step": i, "loss": 2.0 / i}) for i in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(line + "\n" for line in rows))
    return run


def test_report_o_needs_force_and_its_own_loss_png_replaces_a_planted_link(tmp_path) -> None:
    run = _run(tmp_path)
    victim = tmp_path / "victim.png"
    victim.write_text("precious\n")
    r = runner.invoke(app, ["report", str(run), "-o", str(victim)])
    assert r.exit_code == 2 and "exists; not overwritten" in r.output and victim.read_text() == "precious\n"
    r = runner.invoke(app, ["report", str(run), "-o", str(victim), "--force"])
    assert r.exit_code == 0 and victim.read_bytes()[:4] == b"\x89PNG"
    victim = _victim(tmp_path)
    (run / "loss.png").symlink_to(victim)  # planted in a run folder someone handed over
    r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "precious\n" and not (run / "loss.png").is_symlink()
    assert (run / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_convert_o_refuses_a_link(tmp_path) -> None:
    victim = _victim(tmp_path)
    link = tmp_path / "out.yaml"
    link.symlink_to(victim)
    r = runner.invoke(app, ["convert", BASE, "-o", str(link)])
    assert r.exit_code == 2 and "a link to" in r.output and victim.read_text() == "precious\n"
    r = runner.invoke(app, ["convert", BASE, "-o", str(link), "--force"])
    assert r.exit_code == 0, r.output
    assert not link.is_symlink() and "fsdp" in link.read_text() and victim.read_text() == "precious\n"


def test_reports_own_output_is_escaped_on_the_console(tmp_path, monkeypatch) -> None:
    """Not a finding (the table's run names, the plot's path, a usage error): the console door cleans them too."""
    run = _run(tmp_path, "run" + HOSTILE.replace("/", ""))
    code, out, err = _cli(monkeypatch, "report", str(run))
    assert code == 0 and b"\\x1b]0;PWNED" in out, (out + err).decode()
    code, out, err = _cli(monkeypatch, "report", str(tmp_path / ("gone" + HOSTILE.replace("/", ""))))
    assert code == 2 and b"gone\\x1b]0;PWNED" in err
    for seq in OBEYED:
        assert seq not in out + err


# --- report's readers ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_report_refuses_a_metrics_file_that_never_ends(tmp_path, kind) -> None:
    run = tmp_path / "run"
    run.mkdir()
    if kind == "fifo":
        os.mkfifo(run / "metrics.jsonl")
    else:
        (run / "metrics.jsonl").symlink_to("/dev/zero")
    with within(20):
        r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and "metrics.jsonl is not a regular file" in r.output, r.output


def test_a_reader_is_bounded(tmp_path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    assert read_bounded(big, 2048) == b"x" * 2048
    with pytest.raises(Unreadable, match="larger than"):
        read_bounded(big, 1024)


@pytest.mark.parametrize(
    "bad, said",
    [("{not json", "not a JSON line"), ('{"loss": 1.0}', "no integer step"), ("[1, 2]", "not a JSON object")],
)
def test_a_bad_metrics_line_is_exit_2_naming_file_and_line(tmp_path, bad, said) -> None:
    run = _run(tmp_path, lines=[json.dumps({"step": 1, "loss": 1.0}), bad])
    r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and f"metrics.jsonl:2: {said}" in r.output, r.output


def test_a_broken_summary_is_exit_2_naming_it(tmp_path) -> None:
    run = _run(tmp_path)
    (run / "fsdp_tune_summary.json").write_text('{"kind": "finished", "steps": 3}')
    r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and "fsdp_tune_summary.json: not a run summary" in r.output, r.output
    os.unlink(run / "fsdp_tune_summary.json")
    os.mkfifo(run / "fsdp_tune_summary.json")
    with within(20):
        r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and "not a regular file" in r.output, r.output


# --- the output folder and the run name ----------------------------------------------------------------------------


def test_output_dir_root_is_refused_before_anything_walks_it(tmp_path, monkeypatch, fake_ranks) -> None:
    from fsdp_tune.preflight import checks
    from fsdp_tune.rundir import outdir

    def walked(folder):
        raise AssertionError(f"walked {folder}")

    monkeypatch.setattr(checks, "links_in", walked)
    monkeypatch.setattr(outdir, "links_in", walked)
    with within(60):
        r = runner.invoke(app, ["train", BASE, "--output_dir", "/"])
    assert r.exit_code == 2 and "PF030" in r.output and "the root of the file system" in r.output, r.output
    assert not fake_ranks.specs


def test_a_recipes_home_output_dir_is_expanded_once(tmp_path, monkeypatch) -> None:
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.validate import check

    monkeypatch.setenv("HOME", str(tmp_path))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(Path(BASE).read_text() + "  output_dir: ~/runs/x\n")
    cfg = check(str(recipe), []).config
    assert cfg.training.get("output_dir") == str(tmp_path / "runs" / "x")
    assert decide(cfg, Machine.cpu_only()).output_dir == str(tmp_path / "runs" / "x")
    assert check(BASE, ["--output_dir", "~/y"]).config.training.get("output_dir") == str(tmp_path / "y")


@pytest.mark.parametrize(
    "name",
    ["hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN", "sk-" + "A" * 24, "ghp_" + "x1" * 18, "sk-proj-" + "ab_cd-" * 5],
)
def test_a_token_like_run_name_is_refused(name) -> None:
    r = runner.invoke(app, ["validate-config", BASE, "--run_name", name])
    assert r.exit_code == 2 and "FT078" in r.output and "--run_name" in r.output and name not in r.output, r.output


def test_ordinary_names_and_the_token_setting_itself_are_not_ft078() -> None:
    for flags in (
        ["--run_name", "sk-learn-finetune-experiment-1"],
        ["--run_name", "llama-hf_lora-r16"],
        ["--hub_token", "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"],
    ):
        r = runner.invoke(app, ["validate-config", BASE, *flags])
        assert "FT078" not in r.output, (flags, r.output)


def test_the_run_folders_own_rewrites_replace_a_planted_link(tmp_path) -> None:
    """The stop file the launcher writes on a signal, the summary and markers (write_atomic): a link planted
    during a run is replaced, its target left as it was."""
    from fsdp_tune.launch.stopping import StopRelay
    from fsdp_tune.runfiles import STOP_FILE, write_atomic

    victim = _victim(tmp_path)
    (tmp_path / STOP_FILE).symlink_to(victim)
    StopRelay(tmp_path / STOP_FILE, pid=None).on_signal(signal.SIGTERM)
    assert victim.read_text() == "precious\n" and (tmp_path / STOP_FILE).read_text() == str(int(signal.SIGTERM))
    (tmp_path / "summary.json").symlink_to(victim)
    write_atomic(tmp_path / "summary.json", b"{}")
    assert victim.read_text() == "precious\n" and not (tmp_path / "summary.json").is_symlink()


def test_a_broken_summary_still_lets_the_launcher_report_the_failure(tmp_path) -> None:
    """summary.read's refusal is an exit 2 for `report`, and a ValueError to the launcher (launch/train.py reads a
    failed attempt's folder and shows the failure report instead)."""
    from fsdp_tune import summary

    (tmp_path / "fsdp_tune_summary.json").write_text("{cut")
    with pytest.raises(ValueError, match="not JSON") as refused:
        summary.read(tmp_path)
    assert isinstance(refused.value, UsageError) and refused.value.exit_code == 2


def test_a_metrics_link_to_nothing_is_named(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(tmp_path / "nowhere")
    r = runner.invoke(app, ["report", str(run)])
    assert r.exit_code == 2 and "a link to nothing" in r.output, r.output
