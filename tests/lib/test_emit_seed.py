"""`fsdp-tune train ... --emit KIND -o FILE` for the seed's 70B LoRA launch on 2 x 8 H100, as a user runs it: planned
(the planner's meta-device count imports torch, hence this layer), each file checked against its scheduler's schema
and read back for what it asks; a plan that does not fit is refused and writes nothing; the dry run under a
scheduler's variables says where its topology came from."""

from __future__ import annotations

import json
import shlex
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from tests.conftest import REPO, seed_flags
from tests.scheduler_schemas import PROBLEMS

runner = CliRunner()
CONFIG, FLAGS = seed_flags("run_peft_fsdp.sh")
TWO_BY_EIGHT = ["--num_processes", "16", "--num_machines", "2"]


@pytest.fixture
def seed_folder(tmp_path, monkeypatch):
    """A folder holding the seed's config as the repository does, emitted from (the nodes resolve paths there)."""
    (tmp_path / "configs").mkdir()
    shutil.copy(REPO / CONFIG, tmp_path / CONFIG)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _emit(kind: str, out, *extra: str):
    args = ["train", "--config", CONFIG, *FLAGS, *TWO_BY_EIGHT, "--emit", kind, "-o", str(out), *extra]
    return runner.invoke(app, args)


def _node_line(argv: list[str]) -> None:
    """The line every node runs: the seed's flags as given, the job's size, the shared output, resume latest."""
    assert argv[:3] == ["train", "--config", CONFIG]
    kept = [w for w in FLAGS if w not in ("--output_dir", "llama-sft-lora-fsdp")]
    assert argv[3 : 3 + len(kept)] == kept
    tail = argv[3 + len(kept) :]
    assert tail[:4] == TWO_BY_EIGHT and tail[-2:] == ["--resume_from_checkpoint", "latest"]
    assert tail[4] == "--output_dir" and tail[5].endswith("/llama-sft-lora-fsdp")


@pytest.mark.parametrize("kind", ["slurm", "skypilot", "kubeflow"])
def test_seed_70b_lora_on_2x8_gpus(kind: str, seed_folder) -> None:
    out = seed_folder / f"job.{kind}"
    r = _emit(kind, out, "--image", "ghcr.io/example/fsdp-tune:0.1.0")
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output and "2 machine(s) x 8 GPUs; nothing was submitted" in r.output
    text = out.read_text()
    assert PROBLEMS[kind](text) == [], text
    assert "the validated launch: 16 ranks on 2 machine(s) x 8 H100 80GB SXM" in text
    assert "planned GPU memory:" in text and "(fits)" in text and "stop grace: 120 s" in text
    if kind == "slurm":
        assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gpus-per-node=8\n" in text
        assert "#SBATCH --signal=USR1@120\n" in text and "#SBATCH --requeue\n" in text
        srun = next(line for line in text.splitlines() if line.startswith("srun "))
        words = shlex.split(srun)
        _node_line(words[words.index("$FSDP_TUNE") + 1 :])
    elif kind == "skypilot":
        task = yaml.safe_load(text)
        assert task["num_nodes"] == 2 and task["resources"]["accelerators"] == "H100:8"
        _node_line(shlex.split(task["run"])[1:])
    else:
        trainer = yaml.safe_load(text)["spec"]["trainer"]
        assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
        _node_line(trainer["args"])


def test_a_launch_that_does_not_fit_is_not_emitted(seed_folder) -> None:
    out = seed_folder / "job.sbatch"
    r = _emit("slurm", out, "--gpu", "4090")
    assert r.exit_code == 2 and "PF050" in r.output and "out of memory" in r.output, r.output
    assert not out.exists()


def test_the_dry_run_under_a_scheduler_says_where_the_topology_came_from(seed_folder, monkeypatch) -> None:
    env = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "10.0.0.4\n10.0.0.5"}
    for name, value in (env | {"SKYPILOT_NUM_GPUS_PER_NODE": "8"}).items():
        monkeypatch.setenv(name, value)
    r = runner.invoke(app, ["train", "--config", CONFIG, *FLAGS, *TWO_BY_EIGHT, "--dry_run", "--gpu", "h100"])
    refused = "could not start it as it stands" in r.output  # offline here: the seed's hub model and data (PF003)
    assert r.exit_code == (2 if refused else 0), r.output  # a dry run exits as the launch would (#48)
    assert "plan: 16 ranks on 2 machines (8 per machine, this is machine 1)" in r.output
    assert (
        "scheduler: SkyPilot: 2 machine(s) (SKYPILOT_NUM_NODES=2), this is machine 1 (SKYPILOT_NODE_RANK=1)" in r.output
    )
    assert "machine 0 at 10.0.0.4 (the first line of SKYPILOT_NODE_IPS=" in r.output
    assert "--master_addr=10.0.0.4" in r.output


def test_slurm_job_runs_on_the_shared_folder_and_names_what_the_nodes_would_miss(tmp_path, monkeypatch) -> None:
    """#48: emitted from a node-local folder with --shared elsewhere, the job runs in the shared folder (--chdir),
    names the config by its absolute path, says the relative data path would resolve there, and its header does
    not call the emitting folder shared."""
    from tests.conftest import FIXTURES

    work, shared = tmp_path / "work", tmp_path / "shared"
    (work / "data").mkdir(parents=True)
    shared.mkdir()
    shutil.copy(FIXTURES / "tiny_lora.yaml", work / "c.yaml")
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]} for i in range(8)
    ]
    (work / "data" / "x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(work)
    flags = ["--dataset_name", "data/x.jsonl", "--num_processes", "2", "--num_machines", "2"]
    r = runner.invoke(
        app, ["train", "--config", "c.yaml", *flags, "--emit", "slurm", "-o", "job.sbatch", "--shared", str(shared)]
    )
    assert r.exit_code == 0, r.output
    text = (work / "job.sbatch").read_text()
    assert PROBLEMS["slurm"](text) == [], text
    assert f"#SBATCH --chdir={shared}\n" in text and f"cd -- {shared} || exit 1" in text
    srun = shlex.split(next(line for line in text.splitlines() if line.startswith("srun ")))
    assert srun[srun.index("--config") + 1] == str(work / "c.yaml")
    assert f"warning: data data/x.jsonl: relative, and the job runs in {shared} (--chdir" in r.output
    assert f"warning: --config c.yaml: the nodes read {work}/c.yaml, which is not under --shared {shared}" in r.output
    assert f"# shared folder (output, checkpoints, Hugging Face cache): {shared};" in text
    assert str(work) + " (on the filesystem the nodes share)" not in text
