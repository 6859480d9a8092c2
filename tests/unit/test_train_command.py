"""`fsdp-tune train` up to the moment it would start ranks: dry runs, pre-flight refusals, the plan."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.launch.torchrun import torchrun_args
from fsdp_tune.validate import check
from tests.conftest import FIXTURES, REPO, seed_flags

runner = CliRunner()
BASE = str(FIXTURES / "tiny_lora.yaml")
GPUS8 = Machine(cuda=True, gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8)
BASE_ENV = (
    "PYTHONUNBUFFERED",
    "TOKENIZERS_PARALLELISM",
    "ACCELERATE_USE_FSDP",
    "FSDP_CPU_RAM_EFFICIENT_LOADING",
    "OMP_NUM_THREADS",  # what torchrun sets for several ranks per machine when the launcher has none
)


def train(*args: str):
    return runner.invoke(app, ["train", *args])


def test_config_errors_stop_before_anything(tmp_path) -> None:
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--lora_r", "0")
    assert r.exit_code == 2 and "FT060" in r.output
    assert not (tmp_path / "o").exists()


def _data(tmp_path, lines: list[str], name: str = "train.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "lines,rule,text",
    [
        (['{"messages": [{"role": "user", "content": "hi"}]}', '{"messages": [broken'], "PF012", "train.jsonl:2"),
        (['{"prompt": "hi"}'], "PF014", "prompt_completion would also need completion"),
        ([""], "PF013", "empty"),
    ],
)
def test_bad_data_is_caught_before_ranks_start(tmp_path, lines, rule, text) -> None:
    data = _data(tmp_path, lines)
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--dataset_name", str(data))
    assert r.exit_code == 2, r.output
    assert rule in r.output and text in r.output
    assert not (tmp_path / "o").exists()


def test_non_utf8_data(tmp_path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--dataset_name", str(path))
    assert r.exit_code == 2 and "PF011" in r.output and "train.jsonl:2" in r.output


def test_missing_dataset_file(tmp_path) -> None:
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--dataset_name", str(tmp_path / "nope.jsonl"))
    assert r.exit_code == 2 and "does not exist" in r.output


def test_flash_attn_on_cpu_is_refused(tmp_path) -> None:
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--use_flash_attn", "True", "--bf16", "True")
    assert r.exit_code == 2 and "PF020" in r.output


def test_flash_attention_by_name_on_cpu_is_refused(tmp_path) -> None:
    out = str(tmp_path / "o")
    r = train("--config", BASE, "--output_dir", out, "--attn_implementation", "flash_attention_2", "--bf16", "True")
    assert r.exit_code == 2 and "PF020 --attn_implementation" in r.output, r.output


def test_fsdp1_on_cpu_is_refused(tmp_path) -> None:
    """The config says CPU: the rules refuse FSDP1 (FT022) before the machine is even looked at."""
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--fsdp_version", "1")
    assert r.exit_code == 2 and "FT022" in r.output and "PF022" not in r.output and "convert --fsdp2" in r.output


def test_fsdp1_on_a_machine_without_gpus_is_refused(tmp_path) -> None:
    """A GPU config (use_cpu false) on a machine without GPUs: the config's check accepts FSDP1; the same rule, run
    on this machine's decisions before launch, refuses it under the same id."""
    from fsdp_tune.rules.catalog import machine_findings

    flags = ["--use_cpu", "false", "--fsdp_version", "1", "--output_dir", str(tmp_path / "o")]
    checked = check(BASE, flags)
    assert "FT022" not in [f.rule for f in checked.errors]  # a GPU config: FSDP1 is deprecated, not refused
    found = machine_findings(checked.config, Machine.cpu_only(), checked.findings)
    assert [(f.rule, f.severity.value) for f in found] == [("FT022", "error")], found  # one check, one id
    assert "this machine has no GPU" in found[0].message


def test_previous_run_is_not_overwritten(tmp_path) -> None:
    out = tmp_path / "o"
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "adapter_model.safetensors").write_text("x")
    r = train("--config", BASE, "--output_dir", str(out))
    assert r.exit_code == 2 and "--overwrite_output_dir" in r.output and "--resume_from_checkpoint latest" in r.output
    assert (out / "adapter_model.safetensors").read_text() == "x"


def test_push_to_hub_offline_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--push_to_hub")
    assert r.exit_code == 2 and "PF023" in r.output


def test_plan_world_layout() -> None:
    cfg = check(
        None,
        [
            "--num_processes",
            "16",
            "--num_machines",
            "2",
            "--machine_rank",
            "1",
            "--main_process_ip",
            "10.1.2.3",
            "--output_dir",
            "/tmp/x",
        ],
    ).config
    spec = decide(cfg, GPUS8)
    args = torchrun_args(spec)
    assert "--nproc_per_node=8" in args and "--nnodes=2" in args and "--node_rank=1" in args
    assert "--master_addr=10.1.2.3" in args and "--standalone" not in args and spec.backend == "nccl"
    cfg = check(
        None,
        [
            "--num_processes",
            "4",
            "--num_machines",
            "2",
            "--main_process_ip",
            "h",
            "--rdzv_backend",
            "c10d",
            "--output_dir",
            "/tmp/x",
        ],
    ).config
    assert "--rdzv_endpoint=h:29500" in torchrun_args(decide(cfg, GPUS8))


def test_seed_flags_helper_reads_the_script() -> None:
    config, flags = seed_flags("run_peft_fsdp.sh")
    assert config == "configs/fsdp_config.yaml" and flags[:2] == ["--seed", "100"]
    script = (REPO / "scripts" / "run_peft_fsdp.sh").read_text()
    assert "--push_to_hub" in flags and len([f for f in flags if f.startswith("--")]) == script.count("\n--")


def test_missing_tracker_is_refused(tmp_path) -> None:
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    r = train("--config", BASE, "--output_dir", str(tmp_path / "o"), "--report_to", "tensorboard")
    assert r.exit_code == 2 and "PF024" in r.output and "pip install tensorboard" in r.output


def test_cpu_offload_is_off_on_a_cpu_run() -> None:
    """FSDP2's offload policy pins memory for a GPU: on a CPU run it would crash the ranks, and means nothing.
    The rule (FT031) and the rank spec decide it through the same function."""
    checked = check(None, ["--use_cpu", "true", "--fsdp_version", "2", "--fsdp_offload_params", "true"])
    assert [f.rule for f in checked.findings if f.rule == "FT031"] == ["FT031"]
    assert decide(checked.config, GPUS8).fsdp_config.cpu_offload is False  # use_cpu: a CPU run on any machine
    on_gpus = check(None, ["--fsdp_version", "2", "--fsdp_offload_params", "true"])
    assert not [f for f in on_gpus.findings if f.rule == "FT031"]
    assert decide(on_gpus.config, GPUS8).fsdp_config.cpu_offload is True
    assert decide(on_gpus.config, Machine.cpu_only()).fsdp_config.cpu_offload is False


def test_accelerate_launch_keys_reach_the_ranks_environment() -> None:
    """gpu_ids, dynamo_config, enable_cpu_affinity and debug: accelerate launch exports them; so does fsdp-tune."""
    from fsdp_tune.config.writers import to_accelerate

    checked = check(str(FIXTURES / "configs" / "accel_launch_env.yaml"), [])
    assert not checked.errors, checked.findings
    gpu = decide(checked.config, GPUS8)
    assert {k: v for k, v in gpu.env.items() if k not in BASE_ENV} == {
        "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "ACCELERATE_CPU_AFFINITY": "1",
        "ACCELERATE_DEBUG_MODE": "true",
        "ACCELERATE_DYNAMO_BACKEND": "INDUCTOR",
        "ACCELERATE_DYNAMO_MODE": "default",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    }
    assert "CUDA_VISIBLE_DEVICES" not in decide(checked.config, Machine.cpu_only()).env
    assert gpu.world.standalone  # `main_process_port: null` means unset, as accelerate writes it
    written = to_accelerate(checked.config)
    assert written["gpu_ids"] == "0,1,2,3" and written["dynamo_config"]["dynamo_backend"] == "INDUCTOR"
    assert set(decide(check(None, ["--num_processes", "2"]).config, GPUS8).env) == set(BASE_ENV)


def test_more_ranks_than_visible_gpus_is_refused(tmp_path) -> None:
    """One rank per GPU: 4 ranks with 2 visible GPUs would fail in NCCL after loading the model."""
    from fsdp_tune.preflight.checks import check_machine

    flags = ["--use_cpu", "false", "--num_processes", "4", "--output_dir", str(tmp_path / "o")]
    cfg = check(BASE, flags).config
    two = Machine(cuda=True, gpus=2, cuda_visible_devices="0,1")
    [found] = [f for f in check_machine(cfg, decide(cfg, two), two, False) if f.rule == "PF025"]
    assert "would see 2 GPU(s)" in found.message and "--num_processes 2" in found.hint
    four = Machine(cuda=True, gpus=4, cuda_visible_devices="0,1,2,3")
    assert not [f for f in check_machine(cfg, decide(cfg, four), four, False) if f.rule == "PF025"]
    # gpu_ids in the config sets what the ranks see, over the shell's CUDA_VISIBLE_DEVICES (as accelerate launch)
    cfg = check(BASE, [*flags, "--gpu_ids", "0,1,2,3"]).config
    assert not [f for f in check_machine(cfg, decide(cfg, two), two, False) if f.rule == "PF025"]


def _safetensors(path, n_floats: int, cut: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}).encode()
    data = len(header).to_bytes(8, "little") + header + b"\0" * (4 * n_floats)
    path.write_bytes(data[: len(data) - cut])


def test_incomplete_local_weights_are_refused(tmp_path) -> None:
    """A shard missing from the index, or a file cut short, would fail after the ranks loaded the rest."""
    from fsdp_tune.sources.weights import check_weights as _weights

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    _safetensors(model / "model-00001-of-00002.safetensors", 16)
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    [found] = _weights(model, "m")
    assert found.rule == "PF004" and "1 shard(s) named in model.safetensors.index.json are missing" in found.message
    _safetensors(model / "model-00002-of-00002.safetensors", 16, cut=10)
    [found] = _weights(model, "m")
    assert "model-00002-of-00002.safetensors is cut short" in found.message
    _safetensors(model / "model-00002-of-00002.safetensors", 16)
    assert _weights(model, "m") == []
