"""The failure report names the rank that died, not a peer that only lost it (torchrun's timing decides
which one it observes first)."""

from __future__ import annotations

import json

from fsdp_tune.launch.failure import Outcome, failure_report

BLOCK = """[{i}]:
  time      : 2026-11-29_13:29:40
  host      : vm
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 100{rank})
  error_file: {error_file}
  traceback : {traceback}
"""


def _tail(root: str, others: list[str]) -> str:
    return (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "============================================================\n"
        "fsdp_tune.worker FAILED\n------------------------------------------------------------\nFailures:\n"
        + ("".join(others) or "  <NO_OTHER_FAILURES>\n")
        + "------------------------------------------------------------\nRoot Cause (first observed failure):\n"
        + root
        + "============================================================\n"
    )


def _report(tmp_path, tail: str) -> str:
    return str(failure_report(str(tmp_path), Outcome(returncode=1, signal=None, torchrun_tail=tail)))


def test_a_peer_that_lost_its_rank_is_not_the_root_cause(tmp_path) -> None:
    err = tmp_path / "error.json"
    err.write_text(
        json.dumps(
            {
                "message": {
                    "message": "RuntimeError: [gloo/pair.cc:537] Read error "
                    "[127.0.0.1]:16278: Connection reset by peer."
                }
            }
        )
    )
    root = BLOCK.format(i=0, rank=0, code=-15, error_file=err, traceback="see error file")
    killed = BLOCK.format(i=1, rank=1, code=-9, error_file="<N/A>", traceback="Signal 9 (SIGKILL) received")
    text = _report(tmp_path, _tail(root, [killed]))
    assert "training failed on rank 1" in text and "root cause: killed by SIGKILL" in text, text
    assert "then:       rank 0 lost its peer (RuntimeError" in text and "rank-1.log" in text


def test_a_real_exception_stays_the_root_cause(tmp_path) -> None:
    err = tmp_path / "error.json"
    err.write_text(json.dumps({"message": {"message": "ValueError: bad things"}}))
    root = BLOCK.format(i=0, rank=0, code=1, error_file=err, traceback="see error file")
    terminated = BLOCK.format(i=1, rank=1, code=-15, error_file="<N/A>", traceback="Signal 15 (SIGTERM) received")
    text = _report(tmp_path, _tail(root, [terminated]))
    assert "training failed on rank 0" in text and "root cause: ValueError: bad things" in text and "then:" not in text


def test_a_message_over_several_lines_keeps_its_beginning(tmp_path) -> None:
    """fully_shard's refusal ends with a module's repr: its last line is a lone ')'."""
    err = tmp_path / "error.json"
    message = "ValueError: fully_shard does not support containers that do not implement forward: ModuleList(\n"
    message += "  (0-3): 4 x LlamaDecoderLayer(\n    (self_attn): ...\n  )\n)"
    err.write_text(json.dumps({"message": {"message": message}}))
    block = BLOCK.format(i=0, rank=0, code=1, error_file=err, traceback="<see error file>")
    report = _report(tmp_path, _tail(block, []))
    assert "root cause: ValueError: fully_shard does not support containers that do not implement forward" in report


CALLSTACK = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/x.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/src/fsdp_tune/worker/__main__.py", line 28, in main
    run(sys.argv[1], started=STARTED)
  File "/src/fsdp_tune/worker/recipe.py", line 120, in run
    trainer.train(resume_from_checkpoint=resume)
  File "/venv/lib/python3.11/site-packages/transformers/trainer.py", line 2100, in train
    return inner_training_loop(
           ^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 2600, in load_state_dict
    raise RuntimeError(
RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM: size mismatch for lora_A
"""


def _error_file(tmp_path, message: str, callstack: str = "") -> str:
    err = tmp_path / "error.json"
    err.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": callstack}}}))
    return str(err)


def test_the_report_gives_the_frames_that_matter_and_names_both_logs(tmp_path) -> None:
    """The console gets a few lines: root cause, the last frames of the root exception (not torchrun's or the
    entry point's), the rank log for the whole traceback, torchrun's log; no traceback."""
    err = _error_file(tmp_path, "RuntimeError: Error(s) in loading state_dict: size mismatch", CALLSTACK)
    text = _report(tmp_path, _tail(BLOCK.format(i=0, rank=0, code=1, error_file=err, traceback="x"), []))
    lines = text.splitlines()
    assert lines[1] == "  root cause: RuntimeError: Error(s) in loading state_dict: size mismatch"
    assert (
        lines[2] == "  where:      fsdp_tune/worker/recipe.py:120 in run: trainer.train(resume_from_checkpoint=resume)"
    )
    assert lines[3] == "              transformers/trainer.py:2100 in train: return inner_training_loop("
    assert lines[4] == "              torch/nn/modules/module.py:2600 in load_state_dict: raise RuntimeError("
    assert lines[5] == f"  full log:   {tmp_path / 'logs' / 'rank-0.log'} (the whole traceback)"
    assert lines[6] == f"  torchrun:   {tmp_path / 'logs' / 'torchrun.log'}"
    assert lines[7] == "  resume:     no complete checkpoint was written: a new launch starts from step 0"
    assert len(lines) == 8 and "Traceback" not in text and "elastic" not in text


def test_a_chained_exception_shows_where_it_started(tmp_path) -> None:
    chained = (
        CALLSTACK.replace("RuntimeError: Error(s)", "KeyError: 'lora_A'  # Error(s)")
        + "\nThe above exception was the direct cause of the following exception:\n\n"
        + 'Traceback (most recent call last):\n  File "/src/fsdp_tune/worker/errors.py", line 9, in wrap\n'
        + "    raise RuntimeError(describe(err)) from err\nRuntimeError: wrapped\n"
    )
    err = _error_file(tmp_path, "RuntimeError: wrapped", chained)
    text = _report(tmp_path, _tail(BLOCK.format(i=0, rank=0, code=1, error_file=err, traceback="x"), []))
    assert "torch/nn/modules/module.py:2600 in load_state_dict" in text and "errors.py" not in text, text


def test_a_rank_without_an_error_file_is_read_from_its_log(tmp_path) -> None:
    """A full disk takes torchrun's error file too: the rank log's traceback still gives cause and frames."""
    (tmp_path / "logs").mkdir()
    log = "step 1/6\n" + "".join(f"[rank1]: {line}\n" for line in CALLSTACK.splitlines())
    (tmp_path / "logs" / "rank-1.log").write_text(log)
    block = BLOCK.format(i=0, rank=1, code=1, error_file="<N/A>", traceback="<NO TRACEBACK>")
    text = _report(tmp_path, _tail(block, []))
    assert "root cause: RuntimeError: Error(s) in loading state_dict for LlamaForCausalLM" in text, text
    assert "load_state_dict: raise RuntimeError(" in text and "without a Python exception" not in text


def test_a_full_disk_is_the_cause(tmp_path) -> None:
    err = _error_file(tmp_path, "OSError: [Errno 28] No space left on device: 'checkpoint-4/optimizer_0'")
    text = _report(tmp_path, _tail(BLOCK.format(i=0, rank=0, code=1, error_file=err, traceback="x"), []))
    assert f"root cause: the disk holding {tmp_path} is full (" in text and "[Errno 28]" in text, text


def test_no_exception_on_a_disk_with_nothing_free_is_a_full_disk(tmp_path, monkeypatch) -> None:
    from collections import namedtuple

    from fsdp_tune.launch import causes

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(causes.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 4096))
    block = BLOCK.format(i=0, rank=0, code=1, error_file="<N/A>", traceback="<NO TRACEBACK>")
    text = _report(tmp_path, _tail(block, []))
    assert "root cause: the disk holding" in text and "is full (0 MiB free)" in text, text
    assert "without a Python exception" not in text


def test_another_exception_on_a_disk_with_nothing_free_is_a_full_disk_first(tmp_path, monkeypatch) -> None:
    """A checkpoint cut short by a full disk is read back later as broken JSON: the disk is said first, the
    exception beside it."""
    from collections import namedtuple

    from fsdp_tune.launch import causes

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(causes.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 4096))
    err = _error_file(tmp_path, "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)")
    text = _report(tmp_path, _tail(BLOCK.format(i=0, rank=0, code=1, error_file=err, traceback="x"), []))
    assert f"root cause: the disk holding {tmp_path} is full (0 MiB free): a file written there was most" in text, text
    assert "JSONDecodeError" in text, text


def test_a_deleted_output_folder_is_the_cause(tmp_path) -> None:
    gone = tmp_path / "run"
    block = BLOCK.format(i=0, rank=0, code=1, error_file="<N/A>", traceback="<NO TRACEBACK>")
    text = str(failure_report(str(gone), Outcome(1, None, _tail(block, []))))
    assert f"root cause: the output folder {gone} was deleted while the run was running" in text, text
    assert "without a Python exception" not in text and "torchrun exit code" not in text


def test_a_port_in_use_after_launch_is_one_line_with_the_fix(tmp_path) -> None:
    tail = (
        'Traceback (most recent call last):\n  File "/venv/torch/distributed/run.py", line 1032, in <module>\n'
        "    main()\ntorch.distributed.DistNetworkError: The server socket has failed to listen on any local "
        "network address. port: 29555, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n"
    )
    err = failure_report(str(tmp_path), Outcome(1, None, tail))
    assert str(err).splitlines()[0] == (
        "training failed to start: port 29555 is in use on this machine (EADDRINUSE): torchrun could not listen there"
    )
    assert err.hint.startswith("--main_process_port 29556")


def test_torchrun_failing_on_its_own_gives_its_exception(tmp_path) -> None:
    tail = 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n'
    tail += "RendezvousTimeoutError: nodes did not join\n"
    text = _report(tmp_path, tail)
    assert "root cause: RendezvousTimeoutError: nodes did not join" in text and "torchrun.log" in text, text


REWARD_ERROR = "RewardError: reward fewer_chars (my_rewards.py:fewer_chars) raised at step 3: ZeroDivisionError: x"


def test_a_run_stopped_by_a_reward_error_says_where_to_resume_and_report_says_why(tmp_path, fake_ranks) -> None:
    """#48: the failure said what broke but not which checkpoint a resume continues from, and `report` showed the
    run "incomplete" without the reason."""
    from typer.testing import CliRunner

    from fsdp_tune.cli.app import app
    from fsdp_tune.output.tables import format_rows
    from fsdp_tune.runfiles import MANIFEST_NAME, METRICS_NAME
    from fsdp_tune.tools.report import summary_rows
    from tests.conftest import FIXTURES

    out = tmp_path / "run"
    block = BLOCK.format(i=0, rank=1, code=1, error_file=_error_file(tmp_path, REWARD_ERROR), traceback="x")
    fake_ranks.next(checkpoints=[2], returncode=1, torchrun_tail=_tail(block, []))
    flags = ["--output_dir", str(out), "--save_strategy", "steps", "--save_steps", "2"]
    r = CliRunner().invoke(app, ["train", "--config", str(FIXTURES / "tiny_lora.yaml"), *flags])
    said = " ".join(r.output.split())
    assert r.exit_code == 1 and f"root cause: {REWARD_ERROR}" in said, r.output
    assert (
        f"resume: once the cause is fixed, --resume_from_checkpoint latest continues from {out / 'checkpoint-2'}"
        in (said)
    )
    assert json.loads((out / MANIFEST_NAME).read_text())["attempts"][-1]["cause"] == REWARD_ERROR
    (out / METRICS_NAME).write_text('{"step": 2, "loss": 1.5}\n')
    (row,) = summary_rows([out])
    assert (row["status"], row["steps"], row["cause"]) == ("failed", 2, REWARD_ERROR)
    assert f"{out}: failed: {REWARD_ERROR}" in format_rows([row])
