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
    # each library beside its tested range (sources/versions.py); this venv's are all inside
    assert set(info["tested"]) >= {"torch", "transformers", "accelerate", "peft", "trl"}, info["tested"]
    assert all(t["in_range"] for t in info["tested"].values()), info["tested"]
