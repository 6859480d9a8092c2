"""GRPO's generation weights as the plan decides them (planner/generating.py generation_weights): gathered once per
generation where the generation phase with the whole model gathered fits the card, else sharded; the rank spec
carries the launcher's decision (GenerationSpec.weights) and `--grpo_generation` overrides it."""

from __future__ import annotations

from fsdp_tune.planner.plan import memory_plan
from fsdp_tune.validate import check
from tests.conftest import REPO, seed_flags

GRPO = ("--method", "grpo", "--reward_funcs", "length_reward", "--num_generations", "8")
GRPO += ("--per_device_train_batch_size", "8", "--max_completion_length", "256")


def _seed_qlora(*extra: str):
    """The seed's flagship (scripts/run_peft_qlora_fsdp.sh: Llama-2-70B QLoRA, FSDP2, 2 ranks) trained with GRPO."""
    config, flags = seed_flags("run_peft_qlora_fsdp.sh")
    return check(str(REPO / config), [*flags, *GRPO, *extra]).config


def test_the_seeds_70b_qlora_on_two_24gb_cards_generates_sharded() -> None:
    plan = memory_plan(_seed_qlora(), gpu_key="4090")
    gen = plan["grpo_generation"]
    # the 4-bit 70B gathered whole is ~35 GiB: more than a 24 GB card holds beside anything
    assert gen["weights"] == "sharded" and gen["asked"] == "auto", gen
    assert 30 < gen["gathered_model_gib"] < 40 and gen["generation_gathered_gib"] > gen["budget_gib"], gen
    assert "exceeds 23.6 GiB" in gen["why"], gen
    forced = memory_plan(_seed_qlora("--grpo_generation", "gathered"), gpu_key="4090")["grpo_generation"]
    assert forced["weights"] == "gathered" and forced["why"].startswith("--grpo_generation gathered"), forced


def _lora_8b(*extra: str):
    flags = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--use_peft_lora", "True", "--bf16", "True"]
    return check(None, [*flags, *GRPO, "--max_seq_len", "1024", *extra]).config


def test_an_8b_lora_gathers_on_one_h100_and_on_two() -> None:
    one = memory_plan(_lora_8b(), gpu_key="h100")["grpo_generation"]
    assert one["weights"] == "gathered" and one["gathered_model_gib"] == 0 and "one rank" in one["why"], one
    two = memory_plan(_lora_8b("--num_processes", "2"), gpu_key="h100")["grpo_generation"]
    # 2 ranks: the bf16 8B gathered whole (~15 GiB) with the KV cache fits an 80 GB card
    assert two["weights"] == "gathered" and 14 < two["gathered_model_gib"] < 16, two
    assert two["generation_gathered_gib"] + 1 <= two["budget_gib"] and "fits" in two["why"], two
    tight = memory_plan(_lora_8b("--num_processes", "2"), gpu_key="h100", gpu_memory="16GiB")["grpo_generation"]
    assert tight["weights"] == "sharded", tight  # the same run on a 16 GiB card: no room for the whole model
    # the step time: one all-gather of the model per generation, not one per generated token (257 forwards)
    once = memory_plan(_lora_8b("--num_processes", "2"), gpu_key="h100")["step_time"]
    per_token = memory_plan(_lora_8b("--num_processes", "2", "--grpo_generation", "sharded"), gpu_key="h100")
    assert once["comm_gb_per_step_per_gpu"] * 10 < per_token["step_time"]["comm_gb_per_step_per_gpu"], (once, per_token)


def test_the_launcher_writes_the_decision_into_the_rank_spec_and_dry_run_shows_it() -> None:
    from fsdp_tune.decide.method import generation_spec

    spec = generation_spec(_lora_8b("--num_processes", "2"), 2)
    assert spec.weights == "auto" and spec.synced  # settled by the launcher (launch/train.py plan_run)
    assert generation_spec(_lora_8b("--grpo_generation", "sharded"), 2).weights == "sharded"
    assert generation_spec(_lora_8b("--use_vllm", "True", "--grpo_generation", "gathered"), 2).weights == "sharded"


def test_the_launcher_settles_auto_as_the_plan_decides_it() -> None:
    """plan_generation (called by launch/train.py plan_run before decide()) is the plan's decision, which decide()
    puts in the rank spec it makes (nothing is written into it afterwards): the smallest GPU the ranks use, or the
    CPU ranks'; a forced path stays as asked, with the plan's figures; the ranks step together while generating on
    the sharded path only."""
    from dataclasses import replace

    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.preflight.memory import plan_generation

    cfg = _lora_8b("--num_processes", "2")
    big = Machine(cuda=True, gpus=2, gpu_names=("NVIDIA H100 80GB HBM3",) * 2, gpu_memory_mib=(81559, 81559))
    small = replace(big, gpu_memory_mib=(81559, 16384))  # the run is planned on the smaller card
    settled = decide(cfg, big, None, "lines", generation=plan_generation(cfg, big)).generating
    assert settled.weights == "gathered" and "fits 79.6 GiB" in settled.weights_why, settled
    assert not settled.synced  # gathered: no collective inside the generation, each rank stops on its own
    settled = decide(cfg, small, None, "lines", generation=plan_generation(cfg, small)).generating
    assert settled.weights == "sharded" and "exceeds 16.0 GiB" in settled.weights_why, settled
    assert settled.synced  # sharded: every forward all-gathers, the ranks step together
    forced = _lora_8b("--num_processes", "2", "--grpo_generation", "sharded")
    settled = decide(forced, big, None, "lines", generation=plan_generation(forced, big)).generating
    assert settled.weights == "sharded" and settled.weights_why.startswith("--grpo_generation sharded"), settled


def test_no_field_of_the_rank_spec_is_written_after_decide(tmp_path) -> None:
    """train's plan (launch/train.py plan_run, what --dry_run --json prints and the ranks read) is decide()'s spec:
    the generation weights and the data files read once are its inputs, not patches afterwards."""
    from fsdp_tune.decide.data import read_files
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.preflight.memory import plan_generation

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(f'{{"prompt": "Tell me about {w}."}}\n' for w in ("cats", "dogs") * 8))
    big = Machine(cuda=True, gpus=2, gpu_names=("NVIDIA H100 80GB HBM3",) * 2, gpu_memory_mib=(81559, 81559))
    flags = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--use_peft_lora", "True", "--bf16", "True"]
    flags += [*GRPO, "--max_seq_len", "1024", "--num_processes", "2", "--dataset_name", str(data)]
    planned = plan_run(None, [*flags, "--output_dir", str(tmp_path / "out")], lambda _: None, machine=big)
    cfg = planned.config
    decided = decide(cfg, big, None, "lines", files=read_files(cfg), generation=plan_generation(cfg, big))
    assert planned.spec.generating.weights == "gathered" and not planned.spec.generating.synced
    assert planned.spec == decided
