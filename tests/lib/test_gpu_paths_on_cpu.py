"""GPU paths that can be run on a CPU build of torch (issue #21): each scenario in its own process
(tests.lib.gpu_paths_driver.py), with a fake process group whose device mesh says "cuda", or a simulated CUDA
build. Each fails on the code before its fix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.lib.gpu_paths_driver", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("rank", ["0", "1"])
def test_offloaded_shards_never_touch_the_mesh_device(rank: str) -> None:
    """Sharded loading's shards and resume's reload stay in host memory under cpu_offload (a process per rank:
    torch caches shard layouts by mesh, not by rank)."""
    r = _run("offload", rank)
    done = [line for line in r.stdout.splitlines() if line.startswith("ok ")]
    assert r.returncode == 0 and len(done) == 2, r.stdout + r.stderr


def test_one_process_cpu_run_on_a_cuda_build_shards_on_the_cpu() -> None:
    """Without the shim, fully_shard's default mesh goes to the accelerator torch was built for (the premise); with
    it, to the CPU."""
    plain = _run("cpu_default_mesh", "plain")
    assert plain.returncode != 0 and "Torch not compiled with CUDA enabled" in plain.stderr, plain.stderr[-2000:]
    shim = _run("cpu_default_mesh", "shim")
    assert shim.returncode == 0, shim.stderr[-4000:]
