"""A resume that cannot continue its checkpoint is refused before launch (PF039), and a failed attempt never
spoils a finished run's record: the manifest keeps every attempt, the finished run's summary stays until a new
attempt writes its own, and `report` still shows the finished run. (PF031's resume hint with a changed
--lora_r used to crash after launch, rewrite the manifest to r 8 / exit 1 and delete the r 16 run's summary.)"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.runfiles import ADAPTER_CONFIG, MANIFEST_NAME, SUMMARY_NAME
from fsdp_tune.tools.report import summary_rows
from tests.conftest import FIXTURES
from tests.unit.fake_ranks import write_checkpoint

BASE = str(FIXTURES / "tiny_lora.yaml")  # LoRA r 8, alpha 16, all-linear
runner = CliRunner()
SAVE = ("--save_strategy", "steps", "--save_steps", "2")
LATEST = ("--resume_from_checkpoint", "latest")


def train(out, *flags: str):
    return runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(out), *flags])


@pytest.fixture
def finished_run(tmp_path, fake_ranks):  # noqa: F811
    out = tmp_path / "run"
    fake_ranks.next(checkpoints=[2, 4])
    r = train(out, *SAVE, "--lora_r", "16", "--lora_alpha", "32")
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize(
    "flags,said,fix",
    [
        (("--lora_r", "8", "--lora_alpha", "32"), "r 16 (this launch: 8)", "--lora_r 16"),
        (("--lora_r", "16", "--lora_alpha", "16"), "lora_alpha 32 (this launch: 16)", "--lora_alpha 32"),
        (("--lora_r", "16", "--lora_alpha", "32", "--use_dora"), "method LoRA (this launch: DoRA)", ""),
        (
            ("--lora_r", "16", "--lora_alpha", "32", "--lora_target_modules", "q_proj", "v_proj"),
            "target_modules all-linear (this launch: q_proj,v_proj)",
            "--lora_target_modules all-linear",
        ),
        (("--lora_r", "16", "--lora_alpha", "32", "--use_rslora"), "use_rslora false (this launch: true)", ""),
        (("--lora_r", "16", "--lora_alpha", "32", "--method", "kto"), "training method sft (this launch: kto)", ""),
    ],
)
def test_a_resume_whose_adapter_differs_is_refused_before_launch(finished_run, fake_ranks, flags, said, fix) -> None:  # noqa: F811
    manifest = (finished_run / MANIFEST_NAME).read_text()
    r = train(finished_run, *SAVE, *LATEST, *flags)
    assert r.exit_code == 2, r.output
    assert "PF039" in r.output and f"checkpoint-4 was trained with {said}" in r.output, r.output
    assert fix in r.output
    assert len(fake_ranks.specs) == 1  # no rank started
    assert (finished_run / MANIFEST_NAME).read_text() == manifest  # nothing of the run rewritten
    assert json.loads((finished_run / SUMMARY_NAME).read_text())["kind"] == "finished"


def test_the_same_adapter_resumes(finished_run, fake_ranks) -> None:
    fake_ranks.next(checkpoints=[6])
    r = train(finished_run, *SAVE, *LATEST, "--lora_r", "16", "--lora_alpha", "32", "--max_steps", "6")
    assert r.exit_code == 0, r.output


def test_the_checkpoints_own_adapter_config_says_what_it_was(tmp_path, fake_ranks) -> None:
    """A checkpoint named by path, from another folder: its adapter_config.json (the ranks write PEFT's into
    every checkpoint) is what it was trained with."""
    other = write_checkpoint(tmp_path / "elsewhere", 6, "another-run")
    (other / ADAPTER_CONFIG).write_text(json.dumps({"r": 32, "lora_alpha": 64, "target_modules": ["q_proj"]}))
    r = train(tmp_path / "new", "--resume_from_checkpoint", str(other), "--lora_target_modules", "q_proj")
    assert r.exit_code == 2 and "r 32 (this launch: 8); lora_alpha 64 (this launch: 16)" in r.output, r.output
    assert "--lora_r 32 --lora_alpha 64" in r.output


def test_a_failed_attempt_keeps_the_finished_runs_record(finished_run, fake_ranks) -> None:
    before = json.loads((finished_run / MANIFEST_NAME).read_text())
    summary = (finished_run / SUMMARY_NAME).read_text()
    fake_ranks.next(returncode=1)  # the resume crashes after launch
    r = train(finished_run, *SAVE, *LATEST, "--lora_r", "16", "--lora_alpha", "32")
    assert r.exit_code == 1, r.output
    after = json.loads((finished_run / MANIFEST_NAME).read_text())
    assert after["exit_status"] == 0 and after["started_at"] == before["started_at"]  # the finished run's record
    assert after["resolved_config"] == before["resolved_config"]
    assert [a["exit_status"] for a in after["attempts"]] == [0, 1]  # appended, never replaced
    assert after["attempts"][1]["resumed_from"].endswith("checkpoint-4")
    assert (finished_run / SUMMARY_NAME).read_text() == summary  # not deleted, not rewritten
    assert summary_rows([finished_run])[0]["status"] == "finished"

    fake_ranks.next(checkpoints=[8])  # a later attempt that finishes becomes the record
    r = train(finished_run, *SAVE, *LATEST, "--lora_r", "16", "--lora_alpha", "32")
    assert r.exit_code == 0, r.output
    last = json.loads((finished_run / MANIFEST_NAME).read_text())
    assert [a["exit_status"] for a in last["attempts"]] == [0, 1, 0]
    assert last["exit_status"] == 0 and last["started_at"] == last["attempts"][2]["started_at"]
    assert json.loads((finished_run / SUMMARY_NAME).read_text())["steps"] == 8


def test_a_stale_summary_is_not_taken_for_this_attempts(finished_run, fake_ranks) -> None:
    """The launcher reads only the summary its own attempt's ranks wrote: a failed attempt with the finished
    run's summary beside it is reported as failed, not printed as finished."""
    fake_ranks.next(returncode=1)
    r = train(finished_run, *SAVE, *LATEST, "--lora_r", "16", "--lora_alpha", "32")
    assert r.exit_code == 1 and "training failed" in r.output and "done:" not in r.output, r.output


def test_what_peft_made_of_the_same_request_is_no_difference(finished_run, fake_ranks) -> None:
    """PEFT resolves `all-linear` to module names and turns MoE experts into target_parameters in the
    adapter_config.json it saves: the same request resumes, and so do the resolved names spelled out."""
    names = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    saved = {"r": 16, "lora_alpha": 32, "target_modules": names, "target_parameters": ["mlp.experts.down_proj"]}
    (finished_run / "checkpoint-4" / ADAPTER_CONFIG).write_text(json.dumps(saved))
    fake_ranks.next(checkpoints=[6])
    assert train(finished_run, *SAVE, *LATEST, "--lora_r", "16", "--lora_alpha", "32").exit_code == 0
    fake_ranks.next(checkpoints=[8])
    named = ("--resume_from_checkpoint", str(finished_run / "checkpoint-4"), "--lora_target_modules", *names)
    r = train(finished_run, *SAVE, *named, "--lora_r", "16", "--lora_alpha", "32")
    assert "PF039" not in r.output, r.output


R16 = ("--lora_r", "16", "--lora_alpha", "32")


@pytest.mark.parametrize(
    "flags,said,fix",
    [
        (("--learning_rate", "1e-3"), "learning_rate 0.005 (this launch: 0.001)", "--learning_rate 0.005"),
        (("--max_steps", "10"), "max_steps 6 (this launch: 10)", "--max_steps 4 --output_dir"),
        (("--lr_scheduler_type", "cosine"), "lr_scheduler_type linear (this launch: cosine)", ""),
        (("--warmup_steps", "0.1"), "warmup_steps 0 (this launch: 0.1)", "--warmup_steps 0"),
    ],
)
def test_a_resume_that_changes_the_schedule_is_refused_before_launch(finished_run, fake_ranks, flags, said, fix):  # noqa: F811
    """#48: resumed with --learning_rate 1e-3, the run went on at 5e-3 (optimizer.pt and scheduler.pt win) while
    fsdp_tune_run.json recorded 1e-3; `--max_steps 10` on a finished 6-step linear run bent the schedule (0 at
    step 7, then back up). Refused before any rank starts, with the checkpoint's values and a new run's way."""
    manifest = (finished_run / MANIFEST_NAME).read_text()
    r = train(finished_run, *SAVE, *LATEST, *R16, *flags)
    said_all = " ".join(r.output.split())
    assert r.exit_code == 2 and "PF065" in r.output and f"checkpoint-4 was trained with {said}" in said_all, r.output
    assert fix in said_all and f"--adapter {finished_run / 'checkpoint-4'}" not in said_all  # it holds no adapter
    assert f"--adapter {finished_run} " in said_all and f"--output_dir {finished_run}-more" in said_all
    assert len(fake_ranks.specs) == 1  # no rank started
    assert (finished_run / MANIFEST_NAME).read_text() == manifest  # no attempt recorded with what it would not use


def test_more_steps_on_a_schedule_that_does_not_depend_on_them_resume(tmp_path, fake_ranks) -> None:  # noqa: F811
    """A constant learning rate is the same curve for 6 steps or 10: "train 4 more steps" resumes, and the
    attempt's record says max_steps 10, which it used."""
    out, constant = tmp_path / "run", ("--lr_scheduler_type", "constant")
    fake_ranks.next(checkpoints=[2, 4, 6])
    assert train(out, *SAVE, *constant).exit_code == 0
    fake_ranks.next(checkpoints=[8, 10])
    r = train(out, *SAVE, *constant, *LATEST, "--max_steps", "10")
    assert r.exit_code == 0 and "PF065" not in r.output, r.output
    assert fake_ranks.specs[-1].trainer_args.trl_args["max_steps"] == 10
    record = json.loads((out / MANIFEST_NAME).read_text())["attempts"][-1]
    assert record["resolved_config"]["training"]["max_steps"] == 10 and record["exit_status"] == 0


def test_a_changed_learning_rate_on_an_unfinished_run_names_no_adapter_that_is_not_there(tmp_path, fake_ranks) -> None:  # noqa: F811
    """A sharded checkpoint holds no adapter to start a new run from, and a run stopped mid-way has none yet."""
    out = tmp_path / "run"
    fake_ranks.next(stop_at=2)
    assert train(out, *SAVE).exit_code == 143
    r = train(out, *SAVE, *LATEST, "--learning_rate", "1e-3")
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "PF065" in said and "--learning_rate 0.005" in said, r.output
    assert f"once the run has finished (resumed as it was), --adapter {out} --output_dir {out}-more" in said
