"""Two `fsdp-tune train` processes on one machine form one 2-"node" job over loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.dist.conftest import BASE, TIMEOUT, offline_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_loopback(tmp_path, model_cache) -> None:
    port = _free_port()
    out = tmp_path / "run"
    env = offline_env(model_cache)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fsdp_tune",
                "train",
                "--config",
                str(BASE),
                "--output_dir",
                str(out),
                "--max_steps",
                "3",
                "--num_processes",
                "2",
                "--num_machines",
                "2",
                "--machine_rank",
                str(rank),
                "--main_process_ip",
                "127.0.0.1",
                "--main_process_port",
                str(port),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outputs = [p.communicate()[0] for p in procs]
        pytest.fail("the two nodes did not finish in time:\n" + "\n=====\n".join(outputs))
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n=====\n".join(outputs)
    assert "2 ranks on 2 machines (1 per machine, this is machine 0)" in outputs[0]
    assert "this is machine 1" in outputs[1]
    assert "waiting for all 2 machines to join at 127.0.0.1" in outputs[1]
    # one manifest, node 0's, although both launchers share the output folder
    manifest = json.loads((out / "fsdp_tune_run.json").read_text())
    assert manifest["world"]["node_rank"] == 0 and manifest["exit_status"] == 0
    summary = (out / "fsdp_tune_summary.json").read_text()
    assert '"steps": 3' in summary
    assert (out / "logs" / "rank-0.log").exists() and (out / "logs" / "rank-1.log").exists()
    assert (out / "node0-fsdp_tune_resolved.json").exists() and (out / "node1-fsdp_tune_resolved.json").exists()
