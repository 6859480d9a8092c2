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
