"""Stop requests as schedulers deliver them (#17, defect 3), on the launcher's side and in the rank's
signal logic (no torch here; tests/dist/test_preemption.py runs every delivery for real)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.runfiles import MANIFEST_NAME, STOP_FILE
from tests.conftest import FIXTURES
from tests.unit.fake_ranks import stub_launcher

runner = CliRunner()


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_rank_counts_one_delivery_once_and_a_later_signal_as_now() -> None:
    """scancel signals the rank and torchrun forwards the same signal milliseconds later: one request."""
    from fsdp_tune.worker.training.signals import SAME_REQUEST_S, StopRequest

    clock = Clock()
    request = StopRequest(clock)
    request.on_signal(signal.SIGTERM)
    assert request.requested and request.signum == signal.SIGTERM
    clock.now += 0.05
    request.on_signal(signal.SIGTERM)  # torchrun's forward
    clock.now += 1.0
    request.on_signal(signal.SIGUSR1)  # the scheduler's own again
    clock.now += SAME_REQUEST_S
    with pytest.raises(KeyboardInterrupt):  # a person, seconds later
        request.on_signal(signal.SIGTERM)


def test_the_launcher_writes_the_stop_file_once_and_ignores_the_same_delivery(tmp_path) -> None:
    from fsdp_tune.launch.stopping import StopRelay

    clock = Clock()
    relay = StopRelay(tmp_path / STOP_FILE, clock, pid=os.getpid())
    relay.on_signal(signal.SIGUSR1)
    assert (tmp_path / STOP_FILE).read_text() == str(int(signal.SIGUSR1)) and relay.signal == signal.SIGUSR1
    clock.now += 0.5
    relay.on_signal(signal.SIGTERM)  # srun forwarding the cancel: not "at once"
    assert not relay.killed and relay.signal == signal.SIGUSR1


STUCK = (  # a torchrun and a rank (its own session, as torchrun starts ranks) that both ignore SIGTERM
    "import os, signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "time.sleep(600)\n"
)


def test_a_second_signal_later_stops_at_once_even_when_a_rank_is_stuck(tmp_path) -> None:
    """It used to be forwarded as SIGTERM to torchrun, which waits 30 s for a rank stuck in a collective."""
    from fsdp_tune.launch.stopping import children

    launcher = stub_launcher(tmp_path / "o", torchrun_code=STUCK)
    try:
        [torchrun] = children(launcher.pid)
        deadline = time.monotonic() + 30
        while not children(torchrun):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [rank] = children(torchrun)
        launcher.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        launcher.send_signal(signal.SIGTERM)  # the same delivery: still waiting for the step to end
        time.sleep(3.0)  # SAME_REQUEST_S
        assert launcher.poll() is None
        sent = time.monotonic()
        launcher.send_signal(signal.SIGTERM)  # a person asking again
        _, err = launcher.communicate(timeout=20)
        assert time.monotonic() - sent < 5, err
    finally:
        launcher.kill()
    assert launcher.returncode == 143 and "stopping at once" in err, err
    for pid in (torchrun, rank):
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in _state(pid), f"{pid} survived"


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/status").read().lower()
    except OSError:
        return "zombie"


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT])
def test_the_launcher_turns_every_stop_signal_into_a_stop_request(tmp_path, sig) -> None:
    """SIGHUP (a closed terminal) used to kill fsdp-tune before anything was saved; SIGUSR1 (SLURM's
    --signal) too. Each now writes the stop file (the stub torchrun ends when it appears)."""
    launcher = stub_launcher(tmp_path / "o")
    try:
        launcher.send_signal(sig)
        _, err = launcher.communicate(timeout=30)
    finally:
        launcher.kill()
    assert launcher.returncode == (130 if sig == signal.SIGINT else 143), err
    assert f"stopped by {signal.Signals(sig).name}" in err
    assert "error:" not in err and "interrupted: stopped by" in err, err  # #48: a request, not an error
    assert "no complete checkpoint was written: a new launch starts from step 0" in err  # the stub saves none


def test_a_stop_the_ranks_alone_received_ends_interrupted(tmp_path, fake_ranks) -> None:
    """SIGTERM to the ranks only (the launcher saw nothing, torchrun exited 0) ended with exit 1 and
    KeyError: 'steps'; a scheduler needs 143 and a person the resume hint."""
    fake_ranks.next(stop_at=3)  # the Interrupted summary records SIGTERM
    r = runner.invoke(app, ["train", "--config", str(FIXTURES / "tiny_lora.yaml"), "--output_dir", str(tmp_path / "o")])
    assert r.exit_code == 143, r.output
    assert "stopped at step 3: checkpoint saved; continue with --resume_from_checkpoint latest" in r.output
    assert "stopped by SIGTERM (received by the ranks)" in r.output


def test_ctrl_c_reads_as_an_interruption_with_what_to_resume(tmp_path, fake_ranks) -> None:
    """#48: Ctrl-C ended with `error: stopped by SIGINT`. It is exit 130, said as an interruption, with the
    checkpoint that --resume_from_checkpoint latest continues from."""
    out = tmp_path / "o"
    fake_ranks.next(stop_at=3, signal_seen_by_launcher=signal.SIGINT)
    r = runner.invoke(app, ["train", "--config", str(FIXTURES / "tiny_lora.yaml"), "--output_dir", str(out)])
    assert r.exit_code == 130, r.output
    said = " ".join(r.output.split())
    assert "interrupted: stopped by SIGINT (Ctrl-C)" in said and "error:" not in said, r.output
    resume = "stopped at step 3: checkpoint saved; continue with --resume_from_checkpoint latest"
    assert f"{resume} (it continues from {out / 'checkpoint-3'})" in said, r.output
    attempt = json.loads((out / MANIFEST_NAME).read_text())["attempts"][-1]
    assert attempt["cause"] == "stopped by SIGINT (Ctrl-C)"  # what `report` says of a run stopped before a summary


def test_torchrun_forwards_sigusr1_and_waits_for_the_checkpoint() -> None:
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.launch.torchrun import torchrun_args, torchrun_env
    from fsdp_tune.validate import check

    spec = decide(check(str(FIXTURES / "tiny_lora.yaml"), ["--ddp_timeout", "900"]).config, Machine.cpu_only())
    args = torchrun_args(spec)
    assert "--signals_to_handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in args
    # the grace through the environment: torch 2.11's torchrun (the lent GPU machine's) has no --shutdown_timeout
    assert not any(a.startswith("--shutdown") for a in args)
    assert torchrun_env(spec) == {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "900"}


def test_a_rank_keeps_running_when_its_console_reader_leaves(tmp_path) -> None:
    """`fsdp-tune train | head`: rank 0's stdout is the pipe; a write after head exits raised BrokenPipeError
    and killed rank 0. Its log keeps everything; the rank runs on."""
    code = (
        "import os, sys\n"
        "from fsdp_tune.worker.logs import setup_rank_log\n"
        f"setup_rank_log({str(tmp_path)!r}, 0)\n"
        "print('first', flush=True)\n"
        "sys.stdin.readline()\n"  # the reader has gone by now
        "for i in range(3): print('line', i, flush=True)\n"
        "print('survived', file=sys.stderr, flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "first\n"
    proc.stdout.close()  # head exits
    proc.stdin.write("go\n")
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "line 2" in log and "survived" in log


def test_a_run_that_finished_before_the_stop_took_effect_is_finished(tmp_path, fake_ranks) -> None:
    """The last step was done when the signal came: torchrun ends on its SignalException (exit 1), the
    summary says finished, and so does fsdp-tune (exit 0), as nothing is left to resume."""
    fake_ranks.next(checkpoints=[6], returncode=1, signal_seen_by_launcher=signal.SIGTERM)
    r = runner.invoke(app, ["train", "--config", str(FIXTURES / "tiny_lora.yaml"), "--output_dir", str(tmp_path / "o")])
    assert r.exit_code == 0 and "done: 6 steps" in r.output, r.output
