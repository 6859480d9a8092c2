"""Odd inputs get a clear answer (#26 items 7, 12): `train` prints the pre-flight's warnings (only --dry_run
did); `${VAR}` in a recipe is expanded or refused (a literal `./${RELOUT}/` folder was created); `merge -o RUN`
into a run's folder is refused before writing; a resume on another number of ranks, and data smaller than
one step, are warned with the numbers. The ranks are stood in for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.readers import read_file
from fsdp_tune.rundir.checkpoints import write_marker
from fsdp_tune.runfiles import MANIFEST_NAME
from tests.conftest import FIXTURES
from tests.unit.fake_ranks import write_checkpoint

BASE = FIXTURES / "tiny_lora.yaml"
runner = CliRunner()
TURN = '{{"role": "{}", "content": "{}"}}'


def train(out: Path, *flags: str, config: Path = BASE):
    return runner.invoke(app, ["train", "--config", str(config), "--output_dir", str(out), *flags])


def chat(*turns: tuple[str, str]) -> str:
    return '{"messages": [' + ", ".join(TURN.format(r, c) for r, c in turns) + "]}"


def test_train_prints_the_preflight_warnings(tmp_path, fake_ranks) -> None:
    data = tmp_path / "train.jsonl"
    rows = [chat(("user", f"q{i}"), ("assistant", f"a{i}")) for i in range(8)]
    rows += [chat(("user", "q"), ("assistant", "")), chat(("user", "a"), ("user", "b"), ("assistant", "c"))]
    data.write_text("\n".join(rows) + "\n")
    r = train(tmp_path / "o", "--dataset_name", str(data))
    assert r.exit_code == 0, r.output
    assert "PF017" in r.output and "train.jsonl:9" in r.output and "PF018" in r.output, r.output
    assert len(fake_ranks.specs) == 1


RECIPE = "training:\n  output_dir: ./${RELOUT}/x\n  run_name: ${NAME:-demo}-$${HOME}\n"


def test_env_vars_in_a_recipe_are_expanded_or_refused(tmp_path, monkeypatch) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(BASE.read_text() + RECIPE.removeprefix("training:\n"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RELOUT", raising=False)
    r = train(Path("ignored"), config=recipe)  # the flag wins over the file, but the file is refused first
    assert r.exit_code == 2 and "FT008" in r.output and f"{recipe}:" in r.output and "RELOUT is not set" in r.output
    assert not list(tmp_path.glob("*RELOUT*"))  # never a literal folder
    monkeypatch.setenv("RELOUT", "runs")
    values = {a.path: a.value for a in read_file(str(recipe)).assignments}
    assert values["training.output_dir"] == "./runs/x" and values["training.run_name"] == "demo-${HOME}"
    accelerate = tmp_path / "a.yaml"
    accelerate.write_text("distributed_type: FSDP\nmain_process_ip: ${RELOUT}\n")
    [finding] = read_file(str(accelerate)).findings[:1]
    assert finding.rule == "FT008" and finding.source == f"{accelerate}:2" and "literally" in finding.message


@pytest.mark.parametrize("where", ["its own folder", "another run"])
def test_merge_into_a_run_is_refused_before_writing(tmp_path, where) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "m", "peft_type": "LORA"}))
    (run / "adapter_model.safetensors").write_bytes(b"")
    (run / MANIFEST_NAME).write_text("{}")
    target = run
    if where == "another run":
        target = tmp_path / "other"
        target.mkdir()
        (target / MANIFEST_NAME).write_text("{}")
    before = sorted(p.name for p in target.iterdir())
    r = runner.invoke(app, ["merge", "--adapter", str(run), "-o", str(target), "--base", "m", "--force"])
    assert r.exit_code == 2 and "a full model over it" in r.output and "run-merged" in r.output, r.output
    assert sorted(p.name for p in target.iterdir()) == before


def _checkpoint(out: Path, batch: dict | None) -> None:
    folder = write_checkpoint(out, 2, None)
    if batch is not None:
        write_marker(folder, 2, None, batch)


@pytest.mark.parametrize("recorded", [True, False])
def test_a_resume_on_fewer_ranks_is_warned_with_the_numbers(tmp_path, fake_ranks, recorded) -> None:  # noqa: F811
    """2 -> 1 ranks halved the global batch without a word. From the marker's record, or (a checkpoint of an
    earlier fsdp-tune) from one rng_state_K.pth per rank and trainer_state.json's per-device batch."""
    out = tmp_path / "o"
    _checkpoint(
        out, {"world_size": 2, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1} if recorded else None
    )
    r = train(out, "--resume_from_checkpoint", "latest", "--num_processes", "1")
    assert r.exit_code == 0 and "PF063" in r.output, r.output
    said = " ".join(r.output.split())
    assert "global batch of 8 (2 rank(s) x 4 per device x 1 accumulation step(s))" in said, said
    assert "this run has 4 (1 rank(s)" in said and "--gradient_accumulation_steps 2 keeps a global batch of 8" in said
    assert ("assumed unchanged" in said) is not recorded
    r = train(out, "--resume_from_checkpoint", "latest", "--overwrite_output_dir", "false")  # same ranks: silent
    assert r.exit_code == 0 and "PF063" not in r.output, r.output


def test_fewer_rows_than_one_step_is_warned(tmp_path, fake_ranks) -> None:
    data = tmp_path / "one.jsonl"
    data.write_text(chat(("user", "q"), ("assistant", "a")) + "\n")
    r = train(tmp_path / "o", "--dataset_name", str(data))
    said = " ".join(r.output.split())
    assert r.exit_code == 0 and "PF064" in said and "1 training row(s) for 2 rank(s) x 4 per device (8 a step)" in said
    rows = [chat(("user", f"q{i}"), ("assistant", f"a{i}")) for i in range(8)]
    data.write_text("\n".join(rows) + "\n")
    assert "PF064" not in train(tmp_path / "p", "--dataset_name", str(data)).output
