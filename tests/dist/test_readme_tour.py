"""README.md's quick start, run as written, line by line, in a fresh folder holding only what a clone has
(configs/, scripts/) and this checkout's .venv: each line exits 0, or with the code its comment names
(`# exit 2: FT030`). It failed before (#25 item 10): its last line reported on a run that did not exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, offline_env

EXIT = re.compile(r"#\s*exit (\d+)(?::\s*(\w+))?")


def quick_start() -> list[str]:
    """The commands of the first bash block under '## Quick start', comments and blank lines dropped."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_quick_start_runs_as_written(model_cache: Path, tmp_path: Path) -> None:
    lines = quick_start()
    assert any(" train " in line for line in lines) and any(" report " in line for line in lines)
    for name in ("configs", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])  # the venv running this test
    env = offline_env(model_cache)
    for line in lines:
        want = EXIT.search(line)
        proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
        said = proc.stdout + proc.stderr
        assert proc.returncode == (int(want.group(1)) if want else 0), f"{line}\n{said[-4000:]}"
        if want and want.group(2):
            assert want.group(2) in said, f"{line}: {want.group(2)} not said\n{said[-2000:]}"
    assert (tmp_path / "runs" / "demo" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "runs" / "demo-merged" / "config.json").is_file()
    assert (tmp_path / "demo.png").stat().st_size > 10_000
