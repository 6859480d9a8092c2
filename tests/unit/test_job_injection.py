"""Job files against hostile values (#46): each format x each path a value takes into the file (--shared, the folder
emitted from, output_dir, --run_name, an environment value, a data path, the config's path).

Shell metacharacters are characters: the SLURM script parses (`bash -n`) and, run by bash in a folder of its own
with a stand-in srun, creates no file and hands srun and the environment the literal values; SkyPilot's `run` the
same; each YAML reads back as exactly one document holding the value. Control characters (newline, CR, ESC, NUL,
U+2028) are refused (PF096, exit 2) naming the key they came from, before any file is written.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.errors import PreflightError
from fsdp_tune.printable import has_controls
from fsdp_tune.schedulers import job as jobs
from fsdp_tune.schedulers import jobtext
from fsdp_tune.schedulers.emitters import EMITTERS
from tests.conftest import FIXTURES
from tests.scheduler_schemas import PROBLEMS

KINDS = list(EMITTERS)
PAYLOADS = [
    "s$(touch pwned)",
    "s`touch pwned`",
    "s; touch pwned",
    "s' ; touch pwned ; '",
    's" ; touch pwned ; "',
    "s$HOME${IFS}x",
    "s && touch pwned #",
    "s\\ touch pwned",
]
CONTROLS = ["a\nb", "a\rb", "a\x1b]0;title\x07b", "a\x00b", "a\u2028b", "a\tb"]
# where a value enters the job: (Job field edit, the key PF096 names)
PATHS = ["shared", "workdir", "output_dir", "run_name", "env", "data", "config"]


def _job(kind: str, tmp: Path, where: str = "", value: str = "") -> jobs.Job:
    """A CPU job for `kind`, `value` put where `where` says; the folders it names exist under `tmp`."""
    mount = EMITTERS[kind].mount or str(tmp / "shared")
    out = f"{mount}/run"
    shared = "bucket" if EMITTERS[kind].mount else mount
    args = ["--max_steps", "2", "--run_name", "r", "--dataset_name", "data.jsonl"]
    fields: dict = dict(output_dir=out, shared=shared, env={"HF_HOME": f"{mount}/hf-cache"}, config="c.yaml")
    fields["workdir"] = str(tmp / "work")
    if where == "shared":
        fields["shared"] = value if EMITTERS[kind].mount else str(tmp / value)
        fields["env"] = {"HF_HOME": f"{fields['shared']}/hf-cache"}
    elif where == "workdir":
        fields["workdir"] = str(tmp / value)
    elif where == "output_dir":
        fields["output_dir"] = out = f"{mount}/{value}"
    elif where == "run_name":
        args[3] = value
    elif where == "env":
        fields["env"] = {"HF_HOME": value}
    elif where == "data":
        args[5] = value
    elif where == "config":
        fields["config"] = value
    Path(fields["workdir"]).mkdir(parents=True, exist_ok=True)
    args += ["--output_dir", out, "--resume_from_checkpoint", "latest"]
    common = dict(scheduler=kind, name="run", nodes=2, procs_per_node=1, gpu=None, gpu_name=None, memory_gib=8)
    common |= dict(cpus=1, grace_s=120, args=tuple(args), mount=EMITTERS[kind].mount or mount, image="img")
    return jobs.Job(**common, **fields, facts=("the validated launch: 2 ranks",))


def _run_slurm(text: str, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The script run by bash with a stand-in srun writing its words and HF_HOME: (srun's words, the variables)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$SEEN/argv"\nprintf "%s" "$HF_HOME" > "$SEEN/hf_home"\n')
    srun.chmod(0o755)
    seen = tmp / "seen"
    seen.mkdir()
    script = tmp / "job.sbatch"
    script.write_text(text)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SEEN": str(seen), "SLURM_JOB_ID": "1"}
    done = subprocess.run(["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    argv = (seen / "argv").read_text().split("\0")[:-1]
    return argv, {"HF_HOME": (seen / "hf_home").read_text()}


def _no_payload_file(tmp: Path) -> None:
    made = [p for p in tmp.rglob("*") if p.name == "pwned"]
    assert made == [], made


@pytest.mark.parametrize("where", PATHS)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_slurm_script_keeps_shell_metacharacters_literal(where: str, payload: str, tmp_path) -> None:
    job = _job("slurm", tmp_path, where, payload)
    text = EMITTERS["slurm"].render(job)
    assert PROBLEMS["slurm"](text) == [], text  # bash -n, sbatch's and srun's options
    argv, variables = _run_slurm(text, tmp_path)
    _no_payload_file(tmp_path)
    assert argv == ["--ntasks-per-node=1", "--kill-on-bad-exit=1", "fsdp-tune", *job.argv]
    assert variables == job.env  # the literal value, not expanded


def test_slurm_environment_defaults_yield_to_the_callers_values(tmp_path) -> None:
    text = EMITTERS["slurm"].render(_job("slurm", tmp_path, "env", "s$(touch pwned)"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s|%s" "$HF_HOME" "$1" > "$SEEN"\n')
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SEEN": str(tmp_path / "seen"), "HF_HOME": "/mine"}
    subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, check=True, timeout=30)
    assert (tmp_path / "seen").read_text() == "/mine|--ntasks-per-node=1"
    _no_payload_file(tmp_path)


@pytest.mark.parametrize("where", PATHS)
@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("kind", ["skypilot", "kubeflow"])
def test_yaml_is_one_document_holding_the_literal_value(kind: str, where: str, payload: str, tmp_path) -> None:
    job = _job(kind, tmp_path, where, payload)
    text = EMITTERS[kind].render(job)
    (doc,) = yaml.safe_load_all(text)
    assert PROBLEMS[kind](text) == [], text
    if kind == "skypilot":
        assert shlex.split(doc["run"]) == ["fsdp-tune", *job.argv] and doc["envs"] == job.env
        if where == "shared":
            assert doc["file_mounts"]["/shared"]["name"] == payload
        # the preemption hook, run by bash with the mount at a folder here: the stop file, nothing else
        hook = doc["config"]["hooks"][0]["run"].replace("/shared", str(tmp_path / "mnt"))
        subprocess.run(["bash", "-c", hook], cwd=tmp_path, check=True, timeout=30)
        stop = Path(job.output_dir.replace("/shared", str(tmp_path / "mnt"))) / "fsdp_tune_stop"
        assert stop.read_text() == "15\n"
        _no_payload_file(tmp_path)
    else:
        trainer = doc["spec"]["trainer"]
        assert (
            trainer["args"] == job.argv
            and {e["name"]: e.get("value") for e in trainer["env"]}["HF_HOME"] == (job.env["HF_HOME"])
        )
        if where == "shared":
            claim = doc["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
            volume = claim["template"]["spec"]["template"]["spec"]["volumes"][0]
            assert volume["persistentVolumeClaim"]["claimName"] == payload


@pytest.mark.parametrize("payload", PAYLOADS[:4])
def test_skypilot_run_line_run_by_bash_creates_nothing(payload: str, tmp_path) -> None:
    job = _job("skypilot", tmp_path, "run_name", payload)
    task = yaml.safe_load(EMITTERS["skypilot"].render(job))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fsdp-tune").write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$SEEN"\n')
    (bin_dir / "fsdp-tune").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SEEN": str(tmp_path / "seen"), **task["envs"]}
    subprocess.run(["bash", "-c", task["run"]], cwd=tmp_path, env=env, check=True, timeout=30)
    assert (tmp_path / "seen").read_text().split("\0")[:-1] == job.argv
    _no_payload_file(tmp_path)


KEYS = {
    "shared": "--shared",
    "workdir": "the folder emitted from",
    "output_dir": "--output_dir",
    "run_name": "--run_name",
    "env": "environment HF_HOME",
    "data": "--dataset_name",
    "config": "--config",
}


@pytest.mark.parametrize("where", PATHS)
@pytest.mark.parametrize("control", CONTROLS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_control_character_is_refused_naming_its_key(kind: str, where: str, control: str, tmp_path) -> None:
    job = _job(kind, tmp_path, where, "ok") if where == "workdir" else _job(kind, tmp_path, where, control)
    if where == "workdir":  # the folder is not made: its name only reaches the file
        job = dataclasses.replace(job, workdir=str(tmp_path / control))
    with pytest.raises(PreflightError) as err:
        EMITTERS[kind].render(job)
    rules = {(f.rule, f.key) for f in err.value.findings}
    assert ("PF096", KEYS[where]) in rules, err.value.findings
    said = " ".join(f.message + f.hint for f in err.value.findings)
    assert not has_controls(said)  # the message shows the character escaped, never raw


def test_a_header_comment_cannot_start_a_line() -> None:
    """The door's last line of defence: a Job rendered without its check still keeps comments one line."""
    assert jobtext.comment("x\n---\nkind: Pod") == "# x\\x0a---\\x0akind: Pod\n"
    assert jobtext.comment("x\u2028kind: Pod") == "# x\\u2028kind: Pod\n"


runner = CliRunner()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "c.yaml").write_text((FIXTURES / "tiny_lora.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _emit(kind: str, *flags: str):
    args = ["train", "--config", "c.yaml", "--num_processes", "2", "--num_machines", "2", "--emit", kind]
    return runner.invoke(app, [*args, "-o", "job.out", "--image", "img", *flags])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "flags,key",
    [
        (["--shared", "/scratch/s\nrm -rf ~"], "--shared"),
        (["--run_name", "r\x1b[2J"], "--run_name"),
        (["--output_dir", "out\r#SBATCH --x"], "--output_dir"),
        (["--dataset_name", "d\x00.jsonl"], "--dataset_name"),
        (["--image", "img\n---\nkind: Pod"], "--image"),
    ],
)
def test_emit_refuses_a_control_character_with_exit_2(kind, flags, key, folder) -> None:
    r = _emit(kind, *flags)
    assert r.exit_code == 2, r.output
    assert "PF096" in r.output and key in r.output and "control character" in r.output, r.output
    assert not (folder / "job.out").exists() and not list(folder.glob("out*"))


def test_emit_names_a_recipe_key_and_its_line(folder) -> None:
    text = (folder / "c.yaml").read_text().replace("training:\n", 'training:\n  output_dir: "runs/a\\nb"\n')
    (folder / "c.yaml").write_text(text)
    line = text.splitlines().index('  output_dir: "runs/a\\nb"') + 1
    r = _emit("kubeflow")
    assert r.exit_code == 2 and "PF096" in r.output, r.output
    assert f"PF096 training.output_dir (c.yaml:{line}): runs/a\\x0ab holds a control character" in r.output
    assert not (folder / "job.out").exists() and not (folder / "runs").exists()


def test_emit_refuses_a_working_folder_with_a_control_character(tmp_path, monkeypatch) -> None:
    work = tmp_path / "w\x1bx"
    work.mkdir()
    (work / "c.yaml").write_text((FIXTURES / "tiny_lora.yaml").read_text())
    monkeypatch.chdir(work)
    r = _emit("slurm")
    assert r.exit_code == 2 and "PF096" in r.output and "the folder emitted from" in r.output, r.output
    assert not (work / "job.out").exists()


def test_a_render_names_the_recipe_line_of_output_dir(tmp_path) -> None:
    job = dataclasses.replace(
        _job("slurm", tmp_path, "output_dir", "a\nb"), origins={"output_dir": ("output_dir", "r.yaml:3")}
    )
    with pytest.raises(PreflightError) as err:
        EMITTERS["slurm"].render(job)
    assert {(f.key, f.source) for f in err.value.findings} == {("output_dir", "r.yaml:3")}
