"""Pre-flight for what would otherwise fail on every rank after launch: a broken model folder (config.json,
model_type, tokenizer, weights whose shapes disagree with config.json), a rendezvous port already taken, a Hub
model that is not cached with a Hub that does not answer, and trackers that cannot start."""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.preflight import reach
from fsdp_tune.sources.modelcheck import check_model_folder
from fsdp_tune.validate import check
from tests.conftest import FIXTURES

runner = CliRunner()
BASE = str(FIXTURES / "tiny_lora.yaml")
CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
    "vocab_size": 32,
}


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    """A real safetensors file (header + zero bytes): what the launcher reads is only the header."""
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4 * shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def _model(tmp_path: Path, config: dict | str = CONFIG, tokenizer: bool = True) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    _safetensors(
        folder / "model.safetensors",
        {
            "model.embed_tokens.weight": [32, 8],
            "model.layers.0.self_attn.q_proj.weight": [8, 8],
            "model.layers.0.self_attn.k_proj.weight": [4, 8],
            "model.layers.0.self_attn.v_proj.weight": [4, 8],
            "model.layers.0.self_attn.o_proj.weight": [8, 8],
            "model.layers.0.mlp.gate_proj.weight": [16, 8],
            "model.layers.0.mlp.up_proj.weight": [16, 8],
            "model.layers.0.mlp.down_proj.weight": [8, 16],
            "lm_head.weight": [32, 8],
        },
    )
    return folder


def _rules(folder: Path, trust_remote_code: bool = False) -> dict[str, str]:
    return {f.rule: f.message for f in check_model_folder(folder, str(folder), trust_remote_code)}


def test_a_whole_model_folder_passes(tmp_path) -> None:
    assert _rules(_model(tmp_path)) == {}


def test_a_config_json_that_does_not_parse_is_named_with_its_line(tmp_path) -> None:
    found = _rules(_model(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": 8,,\n}'))
    assert "PF005" in found and "config.json is not valid JSON (line 3" in found["PF005"], found


def test_an_unknown_model_type_is_named_with_the_closest(tmp_path) -> None:
    folder = _model(tmp_path, {**CONFIG, "model_type": "lama"})
    found = check_model_folder(folder, "m", trust_remote_code=False)
    assert [f.rule for f in found] == ["PF005"] and "'lama' is not one the installed transformers knows" in (
        found[0].message
    )
    assert "did you mean model_type 'llama'" in found[0].hint


def test_a_folder_without_tokenizer_files_is_refused(tmp_path) -> None:
    assert "no tokenizer files" in _rules(_model(tmp_path, tokenizer=False))["PF006"]


def test_weights_whose_shapes_disagree_with_config_json_are_refused(tmp_path) -> None:
    """The edited config of tests/dist/test_faults.py (intermediate_size doubled): from_pretrained's
    "ignore_mismatched_sizes" on every rank after launch, before this check."""
    found = _rules(_model(tmp_path, {**CONFIG, "intermediate_size": 32}))
    message = found["PF007"]
    assert "model.layers.0.mlp.gate_proj.weight is [16, 8] in model.safetensors, config.json makes it [32, 8]" in (
        message
    )
    assert "(and 2 more tensors)" in message


def test_model_faults_stop_train_before_launch(tmp_path) -> None:
    folder = _model(tmp_path, {**CONFIG, "intermediate_size": 32}, tokenizer=False)
    r = runner.invoke(
        app, ["train", "--config", BASE, "--model_name_or_path", str(folder), "--output_dir", str(tmp_path / "o")]
    )
    assert r.exit_code == 2, r.output
    assert "PF006" in r.output and "PF007" in r.output
    assert not (tmp_path / "o").exists()


def _dry_run(tmp_path, *flags: str) -> list[dict]:
    argv = ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dry_run", "--json", *flags]
    r = runner.invoke(app, argv)
    found = json.loads(r.stdout)["preflight"]
    errors = any(f["severity"] == "error" for f in found)
    assert r.exit_code == (2 if errors else 0), r.output  # a dry run that could not start exits 2, as the launch
    return found


def test_a_port_in_use_is_one_line_before_launch(tmp_path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        found = _dry_run(tmp_path, "--main_process_port", str(port))
    pf = [f for f in found if f["rule"] == "PF027"]
    assert pf and f"port {port} is in use on this machine (EADDRINUSE)" in pf[0]["message"], found
    assert f"--main_process_port {port + 1}" in pf[0]["hint"]
    assert not [f for f in _dry_run(tmp_path, "--main_process_port", str(port)) if f["rule"] == "PF027"]  # freed


def _closed_port() -> int:
    """A port nothing listens on: connecting is refused at once (no timeout to wait for)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_uncached_hub_model_with_the_hub_unreachable_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    reach.unreachable.cache_clear()
    found = _dry_run(tmp_path, "--model_name_or_path", "acme/not-cached")
    pf = [f for f in found if f["rule"] == "PF003"]
    assert pf and "not in the local cache and the Hub" in pf[0]["message"] and "cannot be reached" in pf[0]["message"]


def test_a_hub_that_answers_at_all_is_reachable() -> None:
    """Any HTTP status is an answer: a 404 for the model's page means the Hub is there."""
    import http.server
    import threading

    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # answers 501
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert reach.unreachable(f"http://127.0.0.1:{server.server_port}/api/models/x") is None
    finally:
        server.shutdown()
        server.server_close()
    assert "refused" in (reach.unreachable(f"http://127.0.0.1:{_closed_port()}/") or "").lower()


def _trackers(monkeypatch, *report_to: str) -> dict[str, str]:
    monkeypatch.setattr(reach, "installed", lambda tracker: tracker != "tensorboard")  # wandb, mlflow "installed"
    cfg = check(None, ["--report_to", *report_to]).config
    return {f.message.split(" ")[0]: f.rule for f in reach.tracker_findings(cfg)}


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    return tmp_path / "netrc"


def test_wandb_without_a_key_or_offline_mode_is_refused(monkeypatch, no_wandb_login) -> None:
    assert _trackers(monkeypatch, "wandb") == {"wandb": "PF028"}
    no_wandb_login.write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert _trackers(monkeypatch, "wandb") == {}
    no_wandb_login.unlink()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert _trackers(monkeypatch, "wandb") == {}
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert _trackers(monkeypatch, "wandb") == {}


def test_mlflow_unreachable_and_tensorboard_missing_are_refused(monkeypatch, no_wandb_login) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    reach.unreachable.cache_clear()
    assert _trackers(monkeypatch, "mlflow", "tensorboard") == {"mlflow's": "PF028", "tensorboard": "PF024"}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:./mlruns")
    assert _trackers(monkeypatch, "mlflow") == {}
    assert _trackers(monkeypatch, "all") == {"wandb": "PF028"}  # `all`: every installed one
