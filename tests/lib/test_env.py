"""`fsdp-tune env --json`: the versions and the machine, as one process reads them."""

from __future__ import annotations

import json
import subprocess
import sys


def test_env_json() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fsdp_tune", "env", "--json"], capture_output=True, text=True, timeout=120
    )
    info = json.loads(r.stdout)
    assert info["versions"]["torch"] and info["cpu_count"] >= 1 and "cuda_available" in info
