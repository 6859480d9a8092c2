"""Expert parallelism (transformers' DistributedConfig ep_size) decided before launch, without torch: the spellings
users bring, the DistributedConfig the ranks load with, and each refusal with its rule id (FT139 the sizes against
the world and the model, FT140 LoRA on the experts, FT141 what such a run cannot take, FT035 tensor parallelism)."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.decide.spec import DistributedSizes
from fsdp_tune.output.run import describe_launch
from fsdp_tune.validate import check

CPU = Machine(cuda=False, gpus=0)
BASE = ["--use_peft_lora", "True", "--num_processes", "2", "--save_strategy", "no"]
ATTENTION = ["--lora_target_modules", "q_proj", "v_proj"]
EP2 = ["--use_parallelism_config", "--ep_size", "2"]


def _rules(checked, severity: str = "error") -> list[str]:
    return sorted({f.rule for f in checked.findings if f.severity.value == severity})


def _moe(tmp_path, model_type: str = "qwen3_moe", experts: int = 4) -> list[str]:
    config = {"model_type": model_type, "num_experts": experts, "num_experts_per_tok": 2, "hidden_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return ["--model_name_or_path", str(tmp_path)]


@pytest.mark.parametrize(
    "spelling",
    [
        ["--use_parallelism_config", "--ep_size", "2"],
        ["--use_parallelism_config", "--parallelism_config_ep_size", "2"],
        ["--use_parallelism_config", "--expert_parallel_size", "2"],
        ["--use_parallelism_config", "--expert_model_parallel_size", "2", "--fsdp_size", "2"],
    ],
)
def test_ep_size_reaches_the_ranks_as_distributed_config(tmp_path, spelling) -> None:
    checked = check(None, [*BASE, *ATTENTION, *_moe(tmp_path), *spelling])
    assert not checked.errors, [str(f) for f in checked.findings]
    spec = decide(checked.config, CPU)
    assert spec.loading.path == "transformers" and spec.loading.distributed_config.kwargs() == {
        "fsdp_size": 2,
        "ep_size": 2,
    }
    # transformers shards at load: accelerate's FSDP is off, by name, and gets no mesh
    assert spec.trainer_args.fsdp is False and spec.env["ACCELERATE_USE_FSDP"] == "false"
    assert spec.parallelism is None
    shown = describe_launch(checked.config, spec, [])  # what --dry_run prints
    assert "from_pretrained(distributed_config=DistributedConfig(fsdp_size=2, ep_size=2))" in shown
    assert "experts: ep 2 x efsdp 1" in shown and "checkpoints: the replicated adapter" in shown


def test_a_recipe_section_and_a_plain_run(tmp_path) -> None:
    recipe = tmp_path / "ep.yaml"
    recipe.write_text("parallelism:\n  enabled: true\n  ep_size: 2\n")
    spec = decide(check(str(recipe), [*BASE, *ATTENTION, *_moe(tmp_path)]).config, CPU)
    assert spec.loading.distributed_config == DistributedSizes(fsdp_size=2, ep_size=2)
    plain = decide(check(None, [*BASE, *ATTENTION, *_moe(tmp_path)]).config, CPU)
    assert plain.loading.distributed_config is None and plain.trainer_args.fsdp is True
    assert plain.env["ACCELERATE_USE_FSDP"] == "true"


def test_ep_size_without_the_parallelism_switch_is_refused(tmp_path) -> None:
    assert "FT040" in _rules(check(None, [*BASE, *ATTENTION, *_moe(tmp_path), "--ep_size", "2"]))


@pytest.mark.parametrize(
    "flags,model,why",
    [
        (["--num_processes", "3", "--ep_size", "3"], ("qwen3_moe", 4), "cannot be split evenly"),
        (["--num_processes", "4", "--ep_size", "3"], ("qwen3_moe", 6), "does not divide the 4 ranks"),
        (["--num_processes", "4", "--parallelism_config_tp_size", "2"], ("qwen3_moe", 4), "tp_size=2"),
        (["--fsdp_version", "1"], ("qwen3_moe", 4), "FSDP1"),
        ([], ("qwen3", 0), "has no experts"),
        ([], ("jetmoe", 4), "no base_model_ep_plan"),
    ],
)
def test_ep_size_against_the_world_and_the_model(tmp_path, flags, model, why) -> None:
    checked = check(None, [*BASE, *ATTENTION, *_moe(tmp_path, *model), *EP2, *flags])
    found = [f for f in checked.findings if f.rule == "FT139"]
    assert any(why in f.message for f in found), [str(f) for f in checked.findings]


def test_lora_on_the_experts_is_refused_with_the_libraries_reason(tmp_path) -> None:
    for targets in (["--lora_target_modules", "all-linear"], ["--target_parameters", "mlp.experts.gate_up_proj"]):
        checked = check(None, [*BASE, *_moe(tmp_path), *EP2, *targets])
        found = [f for f in checked.findings if f.rule == "FT140"]
        assert found and "peft/tuners/lora/layer.py:2323" in found[0].message, [str(f) for f in checked.findings]
    assert "FT140" not in _rules(check(None, [*BASE, *_moe(tmp_path), "--lora_target_modules", "all-linear"]))


@pytest.mark.parametrize(
    "flags,key",
    [
        (["--use_peft_lora", "False"], "use_peft_lora"),
        (["--use_4bit_quantization", "True"], "use_4bit_quantization"),
        (["--save_strategy", "steps", "--load_best_model_at_end", "true"], "load_best_model_at_end"),
    ],
)
def test_what_an_expert_parallel_run_cannot_take(tmp_path, flags, key) -> None:
    checked = check(None, [*BASE, *ATTENTION, *_moe(tmp_path), *EP2, *flags])
    assert any(f.rule == "FT141" and f.key.endswith(key) for f in checked.errors), [str(f) for f in checked.findings]


def test_checkpoints_and_resume_are_taken(tmp_path) -> None:
    """The Trainer's refusal (transformers/trainer.py:633) is met by fsdp-tune's own checkpoint of the replicated
    adapter (worker/saving/replicated.py); tests/dist/test_expert_parallel.py resumes one."""
    saves = ["--save_strategy", "steps", "--save_steps", "2", "--max_steps", "4"]
    checked = check(None, [*BASE, *ATTENTION, *_moe(tmp_path), *EP2, *saves])
    assert not checked.errors, [str(f) for f in checked.findings]
    spec = decide(checked.config, CPU)
    handed = spec.trainer_args.kwargs()
    assert handed["save_strategy"] == "steps" and not handed.get("save_only_model")
    assert spec.checkpoint_on_stop
    assert "FT141" not in _rules(checked, "warning"), [str(f) for f in checked.findings]
    sharded = check(
        None, [*BASE, *ATTENTION, *_moe(tmp_path), *EP2, *saves, "--fsdp_state_dict_type", "FULL_STATE_DICT"]
    )
    dropped = [f for f in sharded.findings if f.rule == "FT141" and f.key.endswith("state_dict_type")]
    assert dropped and dropped[0].severity.value == "warning", [str(f) for f in sharded.findings]
    resumed = check(None, [*BASE, *ATTENTION, *_moe(tmp_path), *EP2, "--resume_from_checkpoint", "latest"])
    assert "FT141" not in _rules(resumed), [str(f) for f in resumed.findings]


def test_fsdp_settings_accelerate_applied_are_dropped_with_a_warning(tmp_path) -> None:
    flags = [*BASE, *ATTENTION, *_moe(tmp_path), *EP2, "--fsdp_activation_checkpointing", "true"]
    checked = check(None, flags)
    assert not checked.errors and "FT141" in _rules(checked, "warning"), [str(f) for f in checked.findings]


def test_tensor_parallel_lora_stays_refused_with_the_reason_found(tmp_path) -> None:
    flags = [*BASE, *ATTENTION, *_moe(tmp_path), "--use_parallelism_config", "--tp_size", "2"]
    found = [f for f in check(None, flags).findings if f.rule == "FT035"]
    assert found and "peft/tuners/lora/layer.py:1102" in found[0].message


def test_the_plan_counts_experts_per_rank_and_the_all_to_all(tmp_path) -> None:
    """Mixtral-like: 8 experts, top-2, hidden 4096, 32 layers; 8 ranks at ep 8, one 4096-token row a step in bf16:
    each (token, expert) pair leaves its rank 7 times in 8, four exchanges (dispatch, combine, both again backward)."""
    from types import SimpleNamespace

    from fsdp_tune.planner.experts import describe, expert_parallel

    shape = SimpleNamespace(n_experts=8, top_k=2, hidden_size=4096, n_layers=32)
    flags = [*BASE, *ATTENTION, *_moe(tmp_path, "mixtral", 8), "--use_parallelism_config", "--ep_size", "8"]
    flags += ["--num_processes", "8", "--per_device_train_batch_size", "1", "--max_seq_len", "4096"]
    ep = expert_parallel(check(None, flags).config, shape, compute_bytes=2)
    assert ep["experts_per_rank"] == 1 and ep["expert_copies"] == 1
    assert ep["all_to_all_gb_per_step_per_gpu"] == pytest.approx(32 * 4 * 4096 * 2 * 7 / 8 * 4096 * 2 / 1e9)
    assert "each rank holds 1 of every layer's 8 experts" in describe(ep)
    assert expert_parallel(check(None, [*BASE, *ATTENTION, *_moe(tmp_path)]).config, shape, 2) is None


def test_the_trace_refuses_expert_parallelism(tmp_path) -> None:
    """plan --trace builds accelerate's FSDP2 units; an ep run's model is transformers' DistributedConfig's."""
    from fsdp_tune.errors import PreflightError
    from fsdp_tune.trace.guard import check_settings

    cfg = check(None, [*BASE, *ATTENTION, *_moe(tmp_path), *EP2]).config
    with pytest.raises(PreflightError) as refused:
        check_settings(cfg, on_cpu=False)
    assert any(f.key == "ep_size" for f in refused.value.findings)


@pytest.mark.parametrize(("written_ep", "now"), [(2, []), (None, EP2)], ids=["ep2 to FSDP", "FSDP to ep2"])
def test_resume_across_sharded_at_load_and_fsdp_is_refused(tmp_path, written_ep, now) -> None:
    """PF051: an expert-parallel checkpoint (the replicated adapter, the Trainer's optimizer.pt) and accelerate's
    FSDP checkpoint do not resume each other; the same layout does."""
    from fsdp_tune.preflight.resume import fsdp_version_findings

    run = tmp_path / "run"
    (run / "checkpoint-2").mkdir(parents=True)
    written = {"fsdp_size": 2, "ep_size": written_ep} if written_ep else None
    spec = {"fsdp_version": 2, "loading": {"path": "transformers", "distributed_config": written}}
    (run / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": spec}))
    flags = [*BASE, *ATTENTION, *_moe(tmp_path), "--output_dir", str(run)]
    (f,) = fsdp_version_findings(str(run / "checkpoint-2"), check(None, [*flags, *now]).config)
    assert f.rule == "PF051" and "different layouts" in f.message, f
    assert ("--ep_size 2" in f.hint) if written_ep else ("drop ep_size" in f.hint), f.hint
    same = EP2 if written_ep else []
    assert fsdp_version_findings(str(run / "checkpoint-2"), check(None, [*flags, *same]).config) == []
