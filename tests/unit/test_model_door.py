"""The model door (sources/model.py): a model's files and its config.json are found in one module, once, and every
other stage reads what it found (`Derived.model`, the rank spec's `ModelSpec.facts`).

test_no_module_outside_the_door_names_config_json walks every module's syntax tree: a string that is a path to a
config.json (`"config.json"` itself, or ending in `/config.json`) anywhere but in a docstring, outside the door, is a
second reader: `folder / "config.json"`, `open(f"{d}/config.json")`, `hf_hub_download(repo, "config.json")`,
`cached_file(base, "config.json")`, a glob for `*/config.json`, or a constant naming it for later. Messages that
mention config.json in prose are not paths and pass.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fsdp_tune.decide.derived import derive
from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.sources.model import hub_cache, model_facts
from fsdp_tune.validate import check
from tests.conftest import REPO, hub_snapshot

PACKAGE = REPO / "fsdp_tune"
DOOR = {"sources/model.py"}
CONFIG = "config.json"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose, not code)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def config_json_paths(source: str) -> list[int]:
    """Lines of `source` where a string names a config.json as a path (see the module's docstring)."""
    tree = ast.parse(source)
    prose = _docstrings(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            value = node.value.strip()
            if value == CONFIG or value.endswith(("/" + CONFIG, "\\" + CONFIG)):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    "code",
    [
        'import json\nconfig = json.loads((folder / "config.json").read_text())',
        'from huggingface_hub import hf_hub_download\npath = hf_hub_download(repo, "config.json")',
        'from transformers.utils import cached_file\npath = cached_file(base, filename="config.json")',
        'data = open(f"{folder}/config.json").read()',
        'found = sorted(snapshots.glob("*/config.json"))',
        'NAME = "config.json"',
    ],
)
def test_the_check_catches_every_way_of_reading_it(code: str) -> None:
    assert config_json_paths(code), code


@pytest.mark.parametrize(
    "code",
    [
        '"""Reads the model\'s config.json once."""',
        'msg = f"{name} has no config.json: not a Transformers model folder"',
        'path = folder / "adapter_config.json"',
        'path = folder / "preprocessor_config.json"',
    ],
)
def test_prose_and_other_files_pass(code: str) -> None:
    assert not config_json_paths(code), code


def test_no_module_outside_the_door_names_config_json() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in DOOR:
            continue
        found += [f"{rel}:{line}" for line in config_json_paths(path.read_text(encoding="utf-8"))]
    assert not found, "config.json read outside the model door (sources/model.py model_facts):\n" + "\n".join(found)


def _cached(tmp_path: Path, monkeypatch, repo_id: str, config: dict, stale: dict | None = None) -> Path:
    """A model in the Hugging Face cache as `hf download` leaves it: models--org--name/refs/main holds the commit,
    snapshots/<commit>/config.json the file (an older snapshot beside it, when `stale`)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    snapshot = hub_snapshot(tmp_path / "hf" / "hub", repo_id)
    snapshot.mkdir(parents=True)
    (snapshot / CONFIG).write_text(json.dumps(config))
    if stale is not None:
        (snapshot.parent / ("b" * 40)).mkdir()
        (snapshot.parent / ("b" * 40) / CONFIG).write_text(json.dumps(stale))
    return snapshot


TINY = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 256,
}


def test_a_cached_hub_model_is_found_at_refs_main(tmp_path, monkeypatch) -> None:
    snapshot = _cached(tmp_path, monkeypatch, "acme/tiny", TINY, stale={**TINY, "hidden_size": 32})
    assert hub_cache() == tmp_path / "hf" / "hub"
    facts = model_facts("acme/tiny")
    assert (facts.where, facts.path) == ("cache", str(snapshot))
    assert facts.config["hidden_size"] == 64  # refs/main's snapshot, not the other one


def test_hf_hub_cache_wins_over_hf_home(tmp_path, monkeypatch) -> None:
    _cached(tmp_path, monkeypatch, "acme/tiny", TINY)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert model_facts("acme/tiny").where == "absent"


def test_a_local_folder_is_recorded_absolute(tmp_path, monkeypatch) -> None:
    (tmp_path / "models" / "mine").mkdir(parents=True)
    (tmp_path / "models" / "mine" / CONFIG).write_text(json.dumps(TINY))
    monkeypatch.chdir(tmp_path)
    facts = model_facts("models/mine")
    assert (facts.where, facts.path) == ("local", str(tmp_path / "models" / "mine"))
    assert facts.config == TINY


def test_an_unreadable_config_is_a_problem_not_a_config(tmp_path) -> None:
    (tmp_path / CONFIG).write_text("{not json")
    facts = model_facts(str(tmp_path))
    assert facts.config is None and facts.problem.startswith("is not valid JSON (line 1")


def test_reference_and_absent() -> None:
    assert model_facts("meta-llama/Llama-2-7b-hf").where == "reference"
    assert model_facts("acme/not-on-this-machine").where == "absent"


def test_decided_once_and_carried_by_the_rank_spec(tmp_path, monkeypatch) -> None:
    """The facts the rules, the pre-flight and the trace read are the ones decide() found: the rank spec carries
    the config.json as it was when decided, so a later change of the file does not reach them."""
    snapshot = _cached(tmp_path, monkeypatch, "acme/tiny", TINY)
    cfg = check(None, ["--model_name_or_path", "acme/tiny", "--use_cpu", "true"]).config
    assert derive(cfg).model.where == "cache"
    spec = decide(cfg, Machine(cuda=False, gpus=0))
    assert spec.model.facts.where == "cache" and spec.model.facts.path == str(snapshot)
    (snapshot / CONFIG).write_text(json.dumps({**TINY, "num_hidden_layers": 9}))
    assert spec.model.facts.config["num_hidden_layers"] == 2


def _plan(*argv: str):
    from typer.testing import CliRunner

    from fsdp_tune.cli.app import app

    return CliRunner().invoke(app, ["plan", *argv])


def test_a_hub_id_not_on_this_machine_names_the_nearest_reference_configs_and_the_download(
    tmp_path, monkeypatch
) -> None:
    """Qwen2.5-72B is not shipped: the message names where it looked, the nearest configs fsdp-tune ships, and the
    command that puts the config where plan then finds it."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    r = _plan("--model_name_or_path", "Qwen/Qwen2.5-72B")
    assert r.exit_code == 2, r.output
    assert "not in the Hugging Face cache" in r.output and str(tmp_path / "hf" / "hub") in r.output
    assert "the nearest: Qwen/Qwen2.5-7B" in r.output
    assert "hf download Qwen/Qwen2.5-72B --include config.json" in r.output


def test_a_hub_id_unlike_any_reference_lists_them_all(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    r = _plan("--model_name_or_path", "acme/zzz")
    assert r.exit_code == 2 and "they are: " in r.output and "meta-llama/Llama-2-7b-hf" in r.output, r.output


def test_a_plan_is_not_a_launch_several_machines_need_no_address() -> None:
    argv = ["--model_name_or_path", "meta-llama/Llama-2-70b-hf", "--num_processes", "16", "--num_machines", "2"]
    assert [f.rule for f in check(None, argv).errors] == ["FT092"]  # a launch does
    assert not check(None, argv, launch=False).errors
