"""`fsdp-tune rows --config FILE [flags]`: the first rows of the training split as rank 0 trains on them, through
train's own pre-flight and rank 0's encoder, without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from tests.conftest import FIXTURES, REPO
from tests.datafiles import jsonl

pytestmark = pytest.mark.lib

BASE = str(FIXTURES / "tiny_lora.yaml")  # max_seq_len 96, the builtin ChatML tokenizer
LONG = {"instruction": "word " * 200, "input": "", "output": "short"}  # the prompt alone fills 96 tokens
QA = {"instruction": "Add 2 and 1.", "input": "", "output": "It is 3."}


def test_rows_marks_what_rank_0_trains_on(tmp_path) -> None:
    data = jsonl(tmp_path / "a.jsonl", [QA, LONG, QA])
    r = CliRunner().invoke(app, ["rows", "--config", BASE, "--dataset_name", str(data), "-n", "2"])
    assert r.exit_code == 0, r.output
    first, skipped = r.output.split(f"\n\n{data}:")[1:]
    assert first.startswith("1: ") and "in the loss" in first
    # the answer alone is in the loss (ChatML: the assistant's text and its end marker), the prompt is not
    assert "[[It is 3.<|im_end|>]]" in first and first.count("[[") == 1 and "Add 2 and 1." in first
    assert skipped.startswith("2: skipped: the prompt fills max_seq_len")
    assert f"{data}:3" not in r.output  # -n 2: two rows

    # the count the header gives is the tokens rank 0's encoder keeps in the loss
    from fsdp_tune.models.tiny import build_tokenizer

    tok = build_tokenizer(512)
    answer = tok("It is 3.<|im_end|>", add_special_tokens=False)["input_ids"]
    assert f"tokens, {len(answer)} in the loss" in first

    bad = CliRunner().invoke(app, ["rows", "--config", BASE, "--dataset_name", str(tmp_path / "none.jsonl")])
    assert bad.exit_code == 2 and "PF010" in bad.output  # train's own pre-flight refusal


def test_rows_runs_without_torch(tmp_path) -> None:
    data = jsonl(tmp_path / "a.jsonl", [QA])
    script = (
        "import sys\nfrom typer.testing import CliRunner\nfrom fsdp_tune.cli.app import app\n"
        f"r = CliRunner().invoke(app, ['rows', '--config', {BASE!r}, '--dataset_name', {str(data)!r}])\n"
        "print(r.exit_code, '[[It is 3.' in r.output, [m for m in ('torch', 'datasets') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.splitlines()[-1] == "0 True []", out.stdout + out.stderr
