"""A wheel built from the repo, installed outside the checkout, answers validate-config and plan: package
data (reference model configs, the SFTConfig field table, the demo data) travels inside the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

from tests.conftest import REPO


def test_wheel_outside_the_checkout(tmp_path) -> None:
    # built from a copy of the tracked files: setuptools' build/ folder in the checkout would keep modules
    # that no longer exist (and a stale build/ must not make this pass)
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in tracked.split():
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    [wheel] = wheels.glob("fsdp_tune-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), HF_HUB_OFFLINE="1")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fsdp_tune", *args],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import fsdp_tune; print(fsdp_tune.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where.stdout  # the wheel's copy, not the checkout's
    checked = cli(
        "validate-config",
        "--use_peft_lora",
        "--model_name_or_path",
        "meta-llama/Llama-2-7b-hf",
        "--lora_target_modules",
        "q_proj,v_proj",
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    planned = cli(
        "plan", "--model_name_or_path", "meta-llama/Llama-2-70b-hf", "--num_processes", "8", "--use_peft_lora", "--json"
    )
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert json.loads(planned.stdout)["total_params"] == 68_976_648_192  # Llama-2-70B, from the shipped config
