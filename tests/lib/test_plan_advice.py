"""`plan`'s advice (#25.4): combinations searched on the planner, the cheapest that fits first, each as complete flags
to paste; the verdict in plain words (allocated vs the allocator's cache); exit codes for scripts; host RAM judged
against this machine when the plan is for it. Library layer: the planner builds the model on the meta device."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.decide.machine import Machine
from fsdp_tune.output.plan import format_plan
from fsdp_tune.planner.plan import memory_plan
from fsdp_tune.validate import check
from tests.conftest import REPO, seed_flags

runner = CliRunner()
# 8B QLoRA at micro-batch 8 x 4096 (the seed's settings otherwise: offload, checkpointing, accumulation 2)
EIGHT_B = ("--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--per_device_train_batch_size", "8")
EIGHT_B += ("--max_seq_len", "4096")


def _cfg(*extra: str):
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    return check(str(REPO / config), [*flags, *extra]).config


def _plan_cli(*extra: str):
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    return runner.invoke(app, ["plan", "--config", str(REPO / config), *flags, *extra])


@pytest.mark.parametrize("extra", [EIGHT_B, ("--fsdp_offload_params", "false", "--fsdp_version", "1")])
def test_every_option_pasted_after_the_command_plans_as_listed(extra: tuple) -> None:
    """The 8B run fits 2 x 24 GB only at the card's capacity (it offered nothing); the 70B FSDP1 run does not fit.
    Each option's flags, added to the command, make the run the planner found fitting, as listed."""
    _pasted_as_listed(lambda *more: _cfg(*extra, *more), "4090")


def test_qlora_and_more_nodes_pasted_plan_as_listed() -> None:
    """70B LoRA with the defaults on 8 x 80 GB (100 GiB): QLoRA's four flags, more nodes (--num_machines)."""
    flags = ["--model_name_or_path", "meta-llama/Llama-2-70b-hf", "--num_processes", "8", "--use_peft_lora", "true"]
    options = _pasted_as_listed(lambda *more: check(None, [*flags, *more]).config, "h100")
    assert any("--use_4bit_quantization true --use_nested_quant true" in o["flags"] for o in options)
    assert any("--num_processes 32 --num_machines 4" in o["flags"] for o in options)


def _pasted_as_listed(make, gpu: str) -> list[dict]:
    plan = memory_plan(make(), gpu_key=gpu)
    assert plan["advice"] and not plan["advice"][0]["at_capacity"], plan
    for option in plan["advice"]:
        pasted = memory_plan(make(*option["flags"].split()), gpu_key=gpu)
        assert pasted["fits"] and pasted["range_gib"] == option["range_gib"], option
        assert pasted["at_capacity"] == option["at_capacity"]
    return plan["advice"]


def test_eight_b_at_capacity_gets_the_same_training_with_a_smaller_micro_batch_first() -> None:
    plan = memory_plan(_cfg(*EIGHT_B), gpu_key="4090")
    assert plan["fits"] and plan["at_capacity"]
    first = plan["advice"][0]
    # the same global batch (8 x 2 -> 4 x 4), on the same GPUs, with room for the allocator's cache
    assert first["flags"] == "--per_device_train_batch_size 4 --gradient_accumulation_steps 4" and first["tier"] == 0
    text = format_plan(plan)
    assert "fits only if the allocator's cache stays under 3.9 GiB" in text
    assert "needs 19.8-33.5 GiB (likely 27.1) of 23.6 GiB" in text
    assert "  ~47.3 s/step  10.3-18.4 GiB  --per_device_train_batch_size 4 --gradient_accumulation_steps 4" in text


def test_options_with_room_come_first_then_by_step_time_within_a_tier() -> None:
    plan = memory_plan(_cfg("--fsdp_offload_params", "false", "--fsdp_version", "1"), gpu_key="4090")
    options = plan["advice"]
    keys = [(o["at_capacity"], o["tier"], o["gpu_s_per_token"]) for o in options]
    assert keys == sorted(keys, key=lambda k: (k[0], k[1], float(f"{k[2]:.3g}")))
    assert "does NOT fit (the allocated peak and CUDA context alone take 34.8 GiB)" in format_plan(plan)
    # more GPUs that cannot keep the global batch say so
    assert any("global batch 32, was 8" in o["note"] for o in options if "--num_processes 8" in o["flags"])


def test_the_search_is_bounded() -> None:
    """Every combination of the axes with the largest micro-batch that fits: a few hundred estimates at most (each
    well under a millisecond), never the meta model again. 70B full fine-tuning at micro-batch 16 on one card."""
    cfg = _cfg("--use_peft_lora", "false", "--use_4bit_quantization", "false", "--per_device_train_batch_size", "16")
    plan = memory_plan(cfg, gpu_key="4090")
    assert not plan["fits"] and 0 < plan["advice_searched"] <= 400


def test_exit_codes_for_scripts() -> None:
    """0 when it fits or an option does; 1 when nothing proposed fits, and with --check when the launch as given
    does not fit; 2 stays a bad config."""
    assert _plan_cli("--gpu", "4090").exit_code == 0
    r = _plan_cli("--gpu", "4090", "--fsdp_version", "1")
    assert r.exit_code == 0 and "does not fit as it stands; what fits" in r.output
    assert _plan_cli("--gpu", "4090", "--fsdp_version", "1", "--check").exit_code == 1
    assert _plan_cli("--gpu", "4090", "--check").exit_code == 0
    nothing = _plan_cli("--gpu_memory", "4GiB", "--model_name_or_path", "meta-llama/Llama-3.1-405B")
    assert nothing.exit_code == 1 and "nothing fsdp-tune tried fits" in nothing.output, nothing.output
    assert _plan_cli("--gpu", "nope").exit_code == 2


def test_host_ram_is_judged_against_this_machine_on_cpu(monkeypatch) -> None:
    monkeypatch.setattr("fsdp_tune.decide.machine.available_ram_gib", lambda *a: 0.25)
    r = runner.invoke(app, ["plan", str(REPO / "configs/demo_cpu.yaml"), "--cpu", "--json"])
    assert r.exit_code == 1, r.output
    plan = json.loads(r.output)
    assert plan["host_ram_gib"] == 0.2 and plan["host_fits"] is False
    monkeypatch.setattr("fsdp_tune.decide.machine.available_ram_gib", lambda *a: 20.0)
    r = runner.invoke(app, ["plan", str(REPO / "configs/demo_cpu.yaml"), "--cpu"])
    assert r.exit_code == 0 and "20.0 GiB available on this machine: fits" in r.output


def test_this_machines_gpus_and_ram_when_no_gpu_is_named(monkeypatch) -> None:
    """No --gpu on a machine with GPUs: the plan is for it (its smallest card, its RAM); --gpu plans another."""
    two = Machine(cuda=True, gpus=2, gpu_names=("NVIDIA GeForce RTX 4090",) * 2, gpu_memory_mib=(24564,) * 2)
    monkeypatch.setattr("fsdp_tune.decide.machine.probe", lambda: two)
    monkeypatch.setattr("fsdp_tune.decide.machine.available_ram_gib", lambda *a: 8.0)
    mine = json.loads(_plan_cli("--json").output)
    assert mine["device"] == "RTX 4090 24GB" and mine["gpu_memory_gib"] == 24.0
    assert mine["host_ram_gib"] == 8.0 and mine["host_fits"] is False  # 12.3 GiB at peak (offload, loading)
    assert _plan_cli("--check").exit_code == 1
    other = json.loads(_plan_cli("--gpu", "h100", "--json").output)
    assert other["device"] == "H100 80GB SXM" and other["host_ram_gib"] is None and other["host_fits"] is None
