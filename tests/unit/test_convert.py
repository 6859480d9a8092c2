"""convert: round trips through every format, FSDP1 -> FSDP2 on the seed YAMLs, refusals."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.tools.convert import convert
from fsdp_tune.validate import check
from tests.conftest import FIXTURES, PEER_CONFIGS, REPO

runner = CliRunner()
PEERS = sorted(PEER_CONFIGS.glob("*.yaml"))
SHIPPED = [REPO / "configs" / n for n in ("fsdp_config.yaml", "fsdp_config_qlora.yaml", "fsdp2.json", "demo_cpu.yaml")]
SHIPPED += [
    FIXTURES / "configs" / n
    for n in ("accel_fsdp2_lora.yaml", "accel_cp.yaml", "tf_prefixed_strings.json", "recipe_lora.yaml")
]


def _same(a, b, sections) -> None:
    for s in sections:
        assert getattr(a, s) == getattr(b, s), s


@pytest.mark.parametrize("path", SHIPPED + PEERS, ids=lambda p: p.name)
@pytest.mark.parametrize("via", ["accelerate", "transformers", "recipe"])
def test_round_trip(path, via, tmp_path) -> None:
    original = check(str(path), []).config
    b, _, _ = convert(str(path), via, False, str(tmp_path / f"b.{'json' if via == 'transformers' else 'yaml'}"), False)
    back_fmt = (
        "transformers"
        if path.suffix == ".json"
        else ("recipe" if "recipe" in path.name or "demo" in path.name else "accelerate")
    )
    a2, _, _ = convert(str(b), back_fmt, False, str(tmp_path / f"a2{path.suffix}"), False)
    again = check(str(a2), []).config
    held = {"transformers": ["fsdp"], "accelerate": ["fsdp", "launch", "parallelism"]}.get(via)
    held = held or ["fsdp", "launch", "parallelism", "model", "data", "lora", "quantization", "run", "training"]
    if back_fmt == "transformers":
        held = ["fsdp"]
    elif back_fmt == "accelerate":
        held = [s for s in held if s in ("fsdp", "launch", "parallelism")]
    _same(original, again, held)


@pytest.mark.parametrize("name", ["fsdp_config.yaml", "fsdp_config_qlora.yaml"])
def test_seed_fsdp1_to_fsdp2(name, tmp_path) -> None:
    r = runner.invoke(app, ["convert", str(REPO / "configs" / name), "--fsdp2", "-o", str(tmp_path / "o.yaml")])
    assert r.exit_code == 0, r.output
    assert "dropped backward_prefetch" in r.output and "fsdp.version: 1 -> 2" in r.output
    checked = check(str(tmp_path / "o.yaml"), [])
    assert not checked.errors and not checked.warnings, checked.findings  # a clean FSDP2 file
    cfg = checked.config
    assert cfg.fsdp.version == 2 and cfg.fsdp.reshard_after_forward is True
    assert cfg.fsdp.cpu_offload is (name == "fsdp_config_qlora.yaml")
    assert (tmp_path / "o.yaml").read_text().startswith("# The PEFT guide's")  # comments kept


def test_comments_kept_on_yaml(tmp_path) -> None:
    src = PEER_CONFIGS / "llamafactory-fsdp-offload.yaml"
    out, _, _ = convert(str(src), None, True, str(tmp_path / "o.yaml"), False)
    text = out.read_text()
    assert "fsdp_offload_params: true  # offload may affect training speed" in text
    assert "num_machines: 1  # the number of nodes" in text


def test_hybrid_shard_needs_several_machines(tmp_path) -> None:
    src = tmp_path / "h.yaml"
    src.write_text("distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n")
    r = runner.invoke(app, ["convert", str(src), "--fsdp2"])
    assert r.exit_code == 2 and "nothing to replicate across" in r.output
    out, notes, _ = convert(
        str(FIXTURES / "configs" / "accel_fsdp1_hybrid.yaml"), None, True, str(tmp_path / "o.yaml"), False
    )
    cfg = check(str(out), []).config
    assert (cfg.parallelism.dp_replicate_size, cfg.parallelism.dp_shard_size) == (2, 8)


def test_never_overwrites_without_force(tmp_path) -> None:
    target = tmp_path / "o.yaml"
    target.write_text("keep me")
    r = runner.invoke(app, ["convert", str(REPO / "configs" / "fsdp2.json"), "--to", "accelerate", "-o", str(target)])
    assert r.exit_code == 2 and "--force" in r.output and target.read_text() == "keep me"
    r = runner.invoke(
        app, ["convert", str(REPO / "configs" / "fsdp2.json"), "--to", "accelerate", "-o", str(target), "--force"]
    )
    assert r.exit_code == 0 and "distributed_type: FSDP" in target.read_text()


def test_accelerate_output_has_the_keys_accelerate_requires(tmp_path) -> None:
    import yaml

    out, _, _ = convert(str(REPO / "configs" / "fsdp2.json"), "accelerate", False, str(tmp_path / "o.yaml"), False)
    data = yaml.safe_load(out.read_text())
    assert {"compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug"} <= set(data)


def test_fsdp2_converts_a_cpu_accelerate_yaml_that_fsdp1_cannot_run(tmp_path) -> None:
    """FSDP1 cannot run on CPU (FT022, whose hint is `convert --fsdp2 FILE`): that command converts it, rather than
    answering with the same hint."""
    src = tmp_path / "cpu.yaml"
    src.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nuse_cpu: true\nnum_processes: 2\n"
        "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
    )
    plain = runner.invoke(app, ["convert", str(src)])
    assert plain.exit_code == 2 and "FT022" in plain.output and f"convert --fsdp2 {src}" in plain.output
    r = runner.invoke(app, ["convert", "--fsdp2", str(src)])
    assert r.exit_code == 0 and "FT022" not in r.output, r.output
    out = tmp_path / "cpu.fsdp2.accelerate.yaml"
    cfg = check(str(out), []).config
    assert cfg.fsdp.version == 2 and cfg.fsdp.reshard_after_forward is True and not check(str(out), []).errors


def test_a_trl_config_file_converts_to_a_recipe(tmp_path) -> None:
    src = tmp_path / "sft.yaml"
    src.write_text("model_name_or_path: builtin:tiny-llama\nuse_peft: true\nlora_r: 8\nlearning_rate: 1.0e-4\n")
    out, _, _ = convert(str(src), None, False, None, False)
    assert out.name == "sft.recipe.yaml"
    again = check(str(out), []).config
    assert again.lora.lora_r == 8 and again.training.get("learning_rate") == 1e-4 and again.lora.use_peft_lora
