"""The CI gates fail what cannot run (#48): `validate-config` reads the data files and the model folder it can
see, as train's pre-flight reads them (preflight/data.py settle; the model door), without torch. Before, it said
ok (exit 0) for a data file that does not exist, columns that match no format, or a model folder that is not
there. (`train --dry_run` exiting 2 on a pre-flight error: tests/lib/test_dry_run.py, its memory plan imports
torch.)"""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app

runner = CliRunner()
MODEL = ["--model_name_or_path", "builtin:tiny-llama"]


def _data(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    ("what", "rule"),
    [("missing_data", "PF010"), ("odd_columns", "PF014"), ("missing_model", "PF002")],
)
def test_validate_config_refuses_files_the_launch_could_not_use(what: str, rule: str, tmp_path) -> None:
    data = str(tmp_path / "nope.jsonl")
    model = MODEL
    if what == "odd_columns":
        data = _data(tmp_path, [{"question": "2+2?", "reply": "4"}] * 3)
    elif what == "missing_model":
        data = _data(tmp_path, [{"prompt": "2+2?", "completion": "4"}] * 3)
        model = ["--model_name_or_path", str(tmp_path / "models" / "mine")]
    r = runner.invoke(app, ["validate-config", *model, "--dataset_name", data])
    assert r.exit_code == 2, r.output
    assert rule in r.output and "is a valid launch config" not in r.output, r.output
    assert "torch" not in sys.modules  # still without torch


def test_validate_config_passes_files_the_launch_can_use(tmp_path) -> None:
    data = _data(tmp_path, [{"prompt": "2+2?", "completion": "4"}] * 3)
    r = runner.invoke(app, ["validate-config", *MODEL, "--dataset_name", data])
    assert r.exit_code == 0 and "is a valid launch config" in r.output, r.output


def test_validate_config_of_a_file_alone_asks_for_no_model_or_data() -> None:
    """An Accelerate YAML names no model and no data: what is not named is not refused."""
    from tests.conftest import REPO

    r = runner.invoke(app, ["validate-config", str(REPO / "tests/fixtures/configs/accel_fsdp2_lora.yaml")])
    assert r.exit_code == 0, r.output
