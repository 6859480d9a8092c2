"""The run's folder and its resume point: one answer each (config/run_folder.py), read by every command.

Before, the default output folder had three answers (the rank spec's fsdp-tune-output, `--emit`'s `output`, a
resume's `latest` looking in the current folder) and "resuming" was derived from the raw training dict three
times; test_nothing_else_reads_the_raw_keys keeps the readers on the one function.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fsdp_tune.config.run_folder import DEFAULT_OUTPUT_DIR, output_dir, resume_request
from fsdp_tune.launch.train import _resume_point
from fsdp_tune.validate import check
from tests.conftest import REPO, spec_for

PACKAGE = REPO / "fsdp_tune"
KEYS = ("output_dir", "resume_from_checkpoint")
OWNER = "config/run_folder.py"


def _raw_reads(source: str) -> list[int]:
    """Lines reading one of KEYS from a config's training settings: `*.get("output_dir")`, `*["output_dir"]`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in KEYS
        ) or (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in KEYS):
            lines.append(node.lineno)
    return lines


def test_the_check_sees_a_raw_read() -> None:
    assert _raw_reads('resuming = bool(cfg.training.get("resume_from_checkpoint"))')
    assert _raw_reads('out = cfg.training.get("output_dir") or "output"')


def test_nothing_else_reads_the_raw_keys() -> None:
    """The launcher side asks config/run_folder.py; the ranks read the rank spec (worker/ is not the launcher)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == OWNER or rel.startswith("worker/"):
            continue
        found += [f"{rel}:{line}" for line in _raw_reads(path.read_text(encoding="utf-8"))]
    assert not found, "read --output_dir / --resume_from_checkpoint outside config/run_folder.py:\n" + "\n".join(found)


def test_without_output_dir_the_rank_spec_and_a_resume_agree(tmp_path, monkeypatch) -> None:
    """No --output_dir: the ranks write to ./fsdp-tune-output, and `--resume_from_checkpoint latest` looks there
    (it looked in the current folder, where no run of this config ever writes)."""
    monkeypatch.chdir(tmp_path)
    flags = ("--model_name_or_path", "builtin:tiny-llama", "--dataset_name", "builtin:demo-chat", "--use_cpu", "true")
    spec = spec_for(*flags)
    assert spec.output_dir == str(tmp_path / DEFAULT_OUTPUT_DIR)
    cfg = check(None, [*flags, "--resume_from_checkpoint", "latest"]).config
    assert output_dir(cfg) == spec.output_dir and resume_request(cfg) == "latest"
    said: list[str] = []
    assert _resume_point(cfg, said.append) is None  # nothing to resume yet: a fresh start, said where it looked
    assert any(DEFAULT_OUTPUT_DIR in line for line in said), said


def test_a_resume_request_is_the_flag_as_given() -> None:
    base = ["--model_name_or_path", "builtin:tiny-llama"]
    assert resume_request(check(None, base).config) is None
    assert resume_request(check(None, [*base, "--resume_from_checkpoint", "runs/x/checkpoint-4"]).config) == (
        "runs/x/checkpoint-4"
    )
    assert Path(output_dir(check(None, [*base, "--output_dir", "runs/a"]).config)).is_absolute()
