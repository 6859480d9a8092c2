"""GRPO on 2 CPU ranks (#32). One torchrun launch runs five recipes (tests/dist/recipes_in_one_group.py; the rank specs
come from the launcher's own plan_run): LoRA with beta > 0 and a learnable reward of the user's, by file path, that
reads the dataset's columns (checkpoints every 4 steps); QLoRA with a built-in, the user's reward by dotted module
path and a reward model (a sequence classifier's folder), weighted; the LoRA run resumed from its checkpoint-8 (its
steps 9-12 are the straight run's); RLOO (--method rloo, 2 steps: the same generation and rewards by the row's
trait, RLOOTrainer's loss, its frozen "ref" copy as the reference); and a run whose model holds a trainable
parameter FSDP does not manage, which the distributed self-check stops at step 1. Every run of the launch has rank
1's completions end after 2 tokens (FSDP_TUNE_TEST_SHORT_GENERATION): the ranks finish decoding apart and the
generation still steps them together; the LoRA runs generate on the sharded policy (--grpo_generation sharded), the
others gather the policy once per generation (training/generation.py). Then, through the CLI as users run it: a
reward that returns NaN on the data's first row refused before launch, and one that raises at step 2 stopping the
run in one line with nothing half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from tests.conftest import REPO
from tests.datafiles import jsonl
from tests.dist.conftest import TIMEOUT, Member, plan_member, run_train

REWARDS = '''
import json
import os


def fewer_chars(completions, budget, topic, trainer_state=None, **kwargs):
    """Shorter completions score higher (in characters): learnable on a tiny random model at a low temperature."""
    who = os.environ.get("RANK", "probe")  # a rank, or the pre-flight's probe (no torchrun around it)
    seen = os.path.join(os.environ["GRPO_TEST_SEEN"], f"{__name__}-{who}.json")
    if not os.path.exists(seen):
        got = {"columns": sorted(["budget", "topic", *kwargs]), "budget": budget[0], "topic": topic[0]}
        with open(seen, "w") as f:
            json.dump({**got, "trainer_state": trainer_state is not None}, f)
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [-len(t) / b for t, b in zip(texts, budget)]


def nan_for_empty(completions, **kwargs):
    return [float("nan") if not c else 1.0 for c in completions]


def fails_at_step_2(completions, trainer_state=None, **kwargs):
    if trainer_state is not None and trainer_state.global_step >= 1:
        raise ValueError("the judge is unreachable")
    return [0.0 for _ in completions]
'''
WORDS = "cats dogs suns trees rivers houses cars moons".split()
GROUPS = ("--method", "grpo", "--num_generations", "8", "--per_device_train_batch_size", "8")
GROUPS += ("--max_completion_length", "8", "--learning_rate", "0.02")
GRPO = (*GROUPS, "--temperature", "0.1")  # logits x10: a tiny random model's distribution can move


def _files(tmp_path: Path) -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    (tmp_path / "grpo_rewards").mkdir()
    (tmp_path / "grpo_rewards" / "__init__.py").write_text("")
    (tmp_path / "grpo_rewards" / "scores.py").write_text(REWARDS)
    (tmp_path / "seen").mkdir()
    words = "cats dogs suns trees rivers houses cars moons".split()
    return jsonl(
        tmp_path / "prompts.jsonl", [{"prompt": f"Tell me about {w}.", "budget": 50, "topic": w} for w in words * 8]
    )


def _reward_model(folder: Path) -> Path:
    """A sequence classifier with one label, saved as a user's reward model would be (random weights)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from fsdp_tune.models.tiny import build_tokenizer

    tok = build_tokenizer(512)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    LlamaForSequenceClassification(config).save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return folder


def _resumed(tmp_path: Path, straight: Member) -> str:
    """The straight run's spec, resumed from its checkpoint-8 into a folder of its own (planned before the launch,
    so before the checkpoint exists: the ranks' resume is what this checks, the launcher's is method-blind)."""
    from fsdp_tune.launch import torchrun

    planned, spec = straight.planned, straight.spec
    out = str(tmp_path / "resumed")
    args = replace(spec.trainer_args, output_dir=out)  # RankSpec.output_dir reads it
    spec = replace(spec, trainer_args=args, resume_from_checkpoint=str(tmp_path / "lora/checkpoint-8"))
    return torchrun.prepare(planned.config, spec, planned.run_id).resolved_path


def _metrics(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "reward" in r]


def test_grpo_lora_qlora_resume_and_the_self_check_in_one_launch(tmp_path, model_cache, monkeypatch) -> None:
    env = {
        "FSDP_TUNE_CACHE": str(model_cache),
        "HF_DATASETS_CACHE": str(model_cache / "datasets"),
        "GRPO_TEST_SEEN": str(tmp_path / "seen"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)  # plan_run materialises the builtin model where the ranks read it
    monkeypatch.chdir(tmp_path)  # the rewards are named relative to here, as a user names them
    data = str(_files(tmp_path))
    lora = plan_member("lora", tmp_path / "lora", (
        *GRPO, "--dataset_name", data, "--reward_funcs", "my_rewards.py:fewer_chars",
        "--beta", "0.01", "--max_steps", "12", "--save_strategy", "steps", "--save_steps", "4",
        "--grpo_generation", "sharded",
    ))  # fmt: skip
    judge = str(_reward_model(tmp_path / "judge"))
    qlora = plan_member("qlora", tmp_path / "qlora", (
        *GRPO, "--dataset_name", data, "--reward_funcs", "grpo_rewards.scores.fewer_chars",
        "length_reward", judge, "--reward_weights", "1", "0.5", "0.1", "--max_steps", "4",
        "--use_4bit_quantization", "True", "--bnb_4bit_compute_dtype", "float32",
    ))  # fmt: skip
    # sampled at temperature 1 its completions differ in length, so the advantages, and the gradients, are not zero
    unmanaged = plan_member(
        "unmanaged",
        tmp_path / "unmanaged",
        (*GROUPS, "--dataset_name", data, "--reward_funcs", "my_rewards.py:fewer_chars"),
    )
    # RLOO (#47): the same generation, rewards and FSDP2 handling, read by the row's trait; its reference is the frozen
    # "ref" copy RLOOTrainer makes whatever beta (made before sharding), its beta 0.05 by default
    rloo = plan_member("rloo", tmp_path / "rloo", (
        "--method", "rloo", "--num_generations", "4", "--per_device_train_batch_size", "8",
        "--max_completion_length", "8", "--learning_rate", "0.02", "--dataset_name", data,
        "--reward_funcs", "my_rewards.py:fewer_chars", "--max_steps", "2",
    ))  # fmt: skip
    assert rloo.spec.method.reference_adapter and rloo.spec.generating.reference == "ref_adapter"
    assert lora.spec.generating.reference == "adapter_disabled" and qlora.spec.generating.reference == "off"
    # today's path as asked; the others gathered once per generation (auto on CPU ranks: planner/generating.py)
    weights = [m.spec.generating.weights for m in (lora, qlora, unmanaged)]
    assert weights == ["sharded", "gathered", "gathered"], weights
    assert [r.kind for r in qlora.spec.generating.rewards] == ["python", "builtin", "reward_model"]
    paths = [lora.resolved, qlora.resolved, _resumed(tmp_path, lora), rloo.resolved, unmanaged.resolved]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "tests.dist.recipes_in_one_group", *paths]
    faults = {"FSDP_TUNE_TEST_SHORT_GENERATION": "1:2", "FSDP_TUNE_TEST_UNMANAGED": "unmanaged"}
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=3 * TIMEOUT, env={**os.environ, **env, **faults}, cwd=REPO
    )
    logs = "".join(
        (tmp_path / n / "logs" / "rank-0.log").read_text()[-3000:]
        for n in ("lora", "qlora", "resumed", "rloo", "unmanaged")
        if (tmp_path / n / "logs" / "rank-0.log").exists()
    )
    # the last recipe fails on both ranks at step 1, in one line; everything before it finished
    assert proc.returncode != 0, proc.stderr[-3000:]
    said = [line for line in logs.splitlines() if "distributed self-check failed" in line]
    assert said and "fsdp_tune_test_bias is a whole copy on each rank and its gradient differs" in said[0], logs
    assert not (tmp_path / "unmanaged" / "adapter_model.safetensors").exists()

    s = json.loads((tmp_path / "lora" / "fsdp_tune_summary.json").read_text())
    assert s["method"] == "grpo" and s["adapter_check"]["ok"] and s["steps"] == 12, s
    assert s["extra"]["self_check"] == {"step": 1, "sharded": 56, "whole": 0, "ok": True}
    rewards = [r["reward"] for r in _metrics(tmp_path / "lora")]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4, rewards  # the policy learned the user's reward
    assert s["method_metrics"]["kl"]["first"] == 0 and s["method_metrics"]["kl"]["last"] > 0  # beta > 0: vs the base
    split = {k: s["method_metrics"][k]["last"] for k in ("timing/generation_s", "timing/scoring_s", "step_time")}
    assert 0 < split["timing/generation_s"] + split["timing/scoring_s"] < split["step_time"], split  # the step's split
    lengths = [(r["completions/min_length"], r["completions/max_length"]) for r in _metrics(tmp_path / "lora")]
    assert lengths[0] == (2, 8), lengths  # rank 1 stopped after 2 tokens, rank 0 went on to 8: no hang
    found = sorted(p.name.rpartition("-")[2] for p in (tmp_path / "seen").glob("fsdp_tune_rewards_my_rewards_*"))
    assert found == ["0.json", "1.json", "probe.json"], found  # both ranks, and the pre-flight on the first row
    for who in ("0", "1", "probe"):
        seen = json.loads(next((tmp_path / "seen").glob(f"fsdp_tune_rewards_my_rewards_*-{who}.json")).read_text())
        assert {"budget", "topic", "prompts", "completion_ids"} <= set(seen["columns"]) and seen["budget"] == 50
        assert seen["trainer_state"] == (who != "probe") and seen["topic"] in WORDS

    q = json.loads((tmp_path / "qlora" / "fsdp_tune_summary.json").read_text())
    scored = {"rewards/fewer_chars/mean", "rewards/length_reward/mean", "rewards/judge/mean"}
    for k in (0, 1):  # the 4-bit model gathered once per generation (its packed storage, as stored), on both ranks
        rank_log = (tmp_path / "qlora" / "logs" / f"rank-{k}.log").read_text()
        assert "generation gathers 7 FSDP units once per generation" in rank_log, rank_log[-2000:]
    assert "generation gathers" not in (tmp_path / "lora" / "logs" / "rank-0.log").read_text()
    assert q["adapter_check"]["ok"] and scored <= set(q["method_metrics"]), q  # the reward model scored too
    assert (tmp_path / "seen" / "grpo_rewards.scores-0.json").exists()  # imported by its module path

    r = json.loads((tmp_path / "rloo" / "fsdp_tune_summary.json").read_text())
    assert r["method"] == "rloo" and r["steps"] == 2 and len(r["losses"]) == 2, r
    assert r["adapter_check"]["ok"] and r["adapter_check"]["zero_lora_B"] == 0, r  # saved, re-opened, trained
    assert {"reward", "rewards/fewer_chars/mean", "kl", "timing/generation_s"} <= set(r["method_metrics"]), r
    assert r["method_metrics"]["kl"]["last"] > 0, r  # the policy moved away from its frozen "ref" copy
    from safetensors import safe_open

    with safe_open(str(tmp_path / "rloo" / "adapter_model.safetensors"), "pt") as saved:
        assert not [k for k in saved.keys() if ".ref." in k]  # the reference copy is not part of the adapter

    straight = {r["step"]: r for r in _metrics(tmp_path / "lora")}
    resumed = {r["step"]: r for r in _metrics(tmp_path / "resumed")}
    assert sorted(resumed) == [9, 10, 11, 12], sorted(resumed)
    for step in resumed:  # the same completions and rewards as the straight run: generation resumed exactly
        assert abs(resumed[step]["reward"] - straight[step]["reward"]) < 1e-6, (step, resumed[step], straight[step])


def test_a_bad_reward_is_refused_before_launch_or_stops_the_run_in_one_line(tmp_path, model_cache, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data = str(_files(tmp_path))
    flags = (*GRPO, "--dataset_name", data, "--max_steps", "3")
    env = {"GRPO_TEST_SEEN": str(tmp_path / "seen")}
    refused = run_train(
        tmp_path / "nan", model_cache, *flags, "--reward_funcs", "my_rewards.py:nan_for_empty", check=False, env=env
    )
    assert refused.proc.returncode == 2, refused.logs()
    said = refused.proc.stderr + refused.proc.stdout
    assert "PF088" in said and "returned nan at position 0" in said, refused.logs()
    assert not (tmp_path / "nan" / "logs").exists()  # no rank started

    failed = run_train(
        tmp_path / "flaky", model_cache, *flags, "--reward_funcs", "my_rewards.py:fails_at_step_2", check=False, env=env
    )
    assert failed.proc.returncode == 1, failed.logs()
    cause = [line for line in (failed.proc.stderr + failed.proc.stdout).splitlines() if "root cause:" in line]
    assert (
        cause and "RewardError: reward fails_at_step_2 (my_rewards.py:fails_at_step_2) raised at step 2: " in cause[0]
    )
    assert "ValueError: the judge is unreachable" in cause[0], failed.logs()
    out = tmp_path / "flaky"
    assert not (out / "adapter_model.safetensors").exists() and not (out / "fsdp_tune_summary.json").exists()
