"""GRPO's pieces in one process (#32): the pre-flight's reward probe (a process of its own), the rewards the ranks
build, rank 0's prompts, generate() called with synced_gpus, the trainer built with the reference as the adapter
switched off (no "ref" adapter) or a starting adapter's copy, vLLM's adapter-only sync against stand-ins (no vLLM
here: by reading), and the memory plan's GRPO phases."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import FIXTURES
from tests.datafiles import jsonl

RECIPE = str(FIXTURES / "configs" / "recipe_grpo.yaml")
BASE = str(FIXTURES / "tiny_lora.yaml")
REWARDS = """
def fewer_chars(completions, budget, **kwargs):
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [-len(t) / b for t, b in zip(texts, budget)]

def nan_for_empty(completions, **kwargs):
    return [float("nan") if not c else 1.0 for c in completions]

def typo(completions, **kwargs):
    return [len(completion) for c in completions]
"""


@pytest.fixture(scope="module")
def tok():
    from fsdp_tune.models.tiny import build_tokenizer

    return build_tokenizer(512)


@pytest.fixture
def prompts(tmp_path):
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    rows = [{"prompt": f"Say something about {w}.", "budget": 50} for w in ("cats", "dogs", "suns", "trees")] * 4
    return jsonl(tmp_path / "prompts.jsonl", rows)


def planned(tmp_path, *flags: str):
    from fsdp_tune.launch.train import plan_run

    args = ["--method", "grpo", "--num_generations", "4", "--max_completion_length", "8", *flags]
    return plan_run(BASE, [*args, "--output_dir", str(tmp_path / "run")], print)


def test_the_preflight_calls_the_users_rewards_on_one_row_in_a_process_of_its_own(
    tmp_path, prompts, monkeypatch
) -> None:
    """A reward that returns NaN or raises on the data's first row is refused before launch (PF088), naming the
    reward, what it returned or the line that raised; a good one passes; a built-in's missing column is PF087."""
    monkeypatch.chdir(tmp_path)
    entries = ["my_rewards.py:fewer_chars", "my_rewards.py:nan_for_empty", "my_rewards.py:typo"]
    found = planned(tmp_path, "--dataset_name", str(prompts), "--reward_funcs", *entries, "exact_match_reward")
    errors = {f.rule: [] for f in found.machine_findings}
    for f in found.machine_findings:
        errors[f.rule].append(f.message)
    assert sorted(errors) == ["PF087", "PF088"], found.machine_findings
    assert len(errors["PF088"]) == 2 and not any("fewer_chars" in m for m in errors["PF088"])
    nan, typo = sorted(errors["PF088"])
    assert nan.startswith("reward my_rewards.py:nan_for_empty returned nan at position 0"), nan
    assert typo.startswith(f"reward my_rewards.py:typo raised at {tmp_path / 'my_rewards.py'}:10: NameError"), typo
    assert errors["PF087"] == [
        "exact_match_reward reads the column(s) answer, which the data lacks (it has: budget, prompt)"
    ]
    # called on the first row decide() read (decide/datafiles.py), named by its file and line: the file is not read
    assert {f.source for f in found.machine_findings} == {f"{prompts}:1"}, found.machine_findings


def test_the_ranks_rewards_are_checked_and_named(tmp_path, prompts, tok, monkeypatch) -> None:
    """Each reward as GRPOTrainer takes it: built-ins and the user's behind the guard (TRL logs them under their
    names), the dataset's columns as keyword lists; a bad result stops in one line."""
    from fsdp_tune.rewards.guard import RewardError
    from fsdp_tune.worker.training.rewards import reward_kwargs

    monkeypatch.chdir(tmp_path)
    spec = planned(tmp_path, "--dataset_name", str(prompts), "--reward_funcs", "my_rewards.py:typo", "length_reward")
    kwargs = reward_kwargs(spec.spec, tok, step=lambda: 2)
    typo, length = kwargs["reward_funcs"]
    assert [f.__name__ for f in (typo, length)] == ["typo", "length_reward"] and kwargs[
        "reward_processing_classes"
    ] == [None, None]
    assert length(prompts=["p"] * 2, completions=["a", "b"], completion_ids=[[1, 2], [1] * 8]) == [0.75, 0.0]
    with pytest.raises(RewardError, match=r"^reward typo \(my_rewards.py:typo\) raised at step 2: NameError"):
        typo(prompts=["p"], completions=["a"], completion_ids=[[1]], budget=[50])


NO_CODE = SimpleNamespace(model=SimpleNamespace(trust_remote_code=False))  # the rank spec's one setting the door reads


def test_a_sequence_classifier_is_a_reward_model_on_every_rank(tmp_path, tok) -> None:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from fsdp_tune.rewards.resolve import resolve
    from fsdp_tune.worker.training.rewards import reward_model

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    LlamaForSequenceClassification(config).save_pretrained(str(tmp_path / "rm"))
    tok.save_pretrained(str(tmp_path / "rm"))
    model, its_tokenizer = reward_model(resolve(str(tmp_path / "rm")), NO_CODE)
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert its_tokenizer.pad_token_id == model.config.pad_token_id


@pytest.mark.parametrize("rank", [0, 1])
def test_a_reward_run_is_its_adapter_merged_onto_its_base(tmp_path, tok, monkeypatch, rank) -> None:
    """A --method reward run as a reward (`--reward_funcs runs/rm`): its base, a causal LM whose files hold no
    `score` head, loaded as a one-label classifier, its adapter (score head included) merged, scoring as base +
    adapter does. On rank 1 under FSDP's loading (transformers leaves what the files lack on the meta device there,
    for FSDP to broadcast) the merged model kept meta weights and the run stopped with "Cannot copy out of meta
    tensor" (#48): every rank scores the same."""
    import json

    import torch
    import torch.distributed as dist
    from peft import LoraConfig, get_peft_model
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from fsdp_tune.rewards.resolve import resolve
    from fsdp_tune.worker.training.rewards import reward_model

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(str(tmp_path / "base"))  # what a reward run trains on
    base = LlamaForSequenceClassification.from_pretrained(str(tmp_path / "base"), num_labels=1)
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], task_type="SEQ_CLS"))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.fill_(0.1)
    run = tmp_path / "rm"
    peft.save_pretrained(str(run))
    tok.save_pretrained(str(run))
    spec = {"method": "reward", "model": {"name_or_path": str(tmp_path / "base"), "dtype": "float32"}}
    (run / "fsdp_tune_resolved.json").write_text(json.dumps({"spec": spec}))
    for key, value in {"ACCELERATE_USE_FSDP": "true", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}.items():
        monkeypatch.setenv(key, value)  # the rank spec's environment (decide/env.py)
    monkeypatch.setenv("LOCAL_RANK", str(rank))
    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        model, _ = reward_model(resolve(str(run)), NO_CODE)
    finally:
        dist.destroy_process_group()
    import os

    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"  # put back for the policy's loading
    assert not any(p.is_meta for p in model.parameters())
    ids = tok("Say it. It.", return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(model(**ids).logits, peft.eval()(**ids).logits, atol=1e-5)
    assert not hasattr(model, "peft_config")  # merged: a plain classifier


def test_rank_0_leaves_out_prompts_that_leave_no_room_for_a_completion(tmp_path, tok, monkeypatch) -> None:
    from fsdp_tune.worker.data import prompts as prepared

    rows = [{"prompt": "Say it.", "n": 1}, {"prompt": "word " * 200, "n": 2}, {"prompt": "", "n": 3}]
    data = jsonl(tmp_path / "p.jsonl", rows)
    spec = planned(tmp_path, "--dataset_name", str(data), "--reward_funcs", "length_reward", "--max_seq_len", "48")
    monkeypatch.setenv("LOCAL_RANK", "0")
    out = prepared.prepare_prompts(spec.spec, tok)
    assert out.train.to_list() == [{"prompt": "Say it.", "n": 1}]
    skipped = out.report["sources"][0]["skipped"]
    assert set(skipped) == {"an empty prompt", f"{prepared.TOO_LONG} (more than 40 tokens)"}, skipped
    assert any("row 2" in r for r in skipped[f"{prepared.TOO_LONG} (more than 40 tokens)"]["rows"])


def test_a_split_with_no_prompt_left_is_refused_with_the_reasons_and_the_fix(tmp_path, tok, monkeypatch) -> None:
    from fsdp_tune.worker.data import prompts as prepared

    data = jsonl(tmp_path / "p.jsonl", [{"prompt": "word " * 200}, {"prompt": ""}])
    spec = planned(tmp_path, "--dataset_name", str(data), "--reward_funcs", "length_reward", "--max_seq_len", "48")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError) as refused:
        prepared.prepare_prompts(spec.spec, tok)
    said = str(refused.value)
    assert said.startswith(f"{data} [train]: no row of the train split can be used (1 row(s): {prepared.TOO_LONG}")
    assert "1 row(s): an empty prompt" in said
    assert said.endswith("(raise --max_seq_len, or lower --max_completion_length)")


def _tiny_peft(tok):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


def test_generate_is_called_with_every_rank_stepping_until_all_finish(tok) -> None:
    from fsdp_tune.worker.training.generation import GenerationClock, install

    model = _tiny_peft(tok)
    seen = []
    inner = model.get_base_model()
    inner.generate = lambda *a, **kw: seen.append(kw) or "generated"
    clock = GenerationClock()
    install(model, "sharded", True, clock)
    install(model, "gathered", True, clock)  # once only
    assert model.generate(input_ids=None) == "generated" and seen == [{"input_ids": None, "synced_gpus": True}]
    assert clock.calls == 1 and clock.take() > 0 and clock.calls == 0
    with pytest.raises(ValueError, match="the launcher decides"):
        install(_tiny_peft(tok), "auto", True)  # the rank never decides: an unsettled spec is our bug


@pytest.mark.parametrize("reference", ["adapter_disabled", "ref_adapter"])
def test_the_reference_is_the_adapter_switched_off_or_a_frozen_copy(tmp_path, tok, reference) -> None:
    """Given a PEFT model and beta > 0, GRPOTrainer adds a "ref" adapter (on a sharded model the copy fails): built
    with beta 0 there is none, the reference forwards then switch the adapter off, and the trainer has its beta."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from fsdp_tune.decide.spec import GenerationSpec
    from fsdp_tune.worker.training.generating import GeneratingOnFsdp
    from fsdp_tune.worker.training.trainer import Saving, fsdp_trainer

    model = _tiny_peft(tok)
    args = GRPOConfig(
        output_dir=str(tmp_path), beta=0.04, num_generations=2, per_device_train_batch_size=2,
        max_completion_length=4, use_cpu=True, report_to="none", max_steps=1,
    )  # fmt: skip
    trainer = fsdp_trainer(GRPOTrainer, GeneratingOnFsdp)(
        model=model,
        args=args,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        train_dataset=Dataset.from_list([{"prompt": "Say it."}] * 4),
        processing_class=tok,
        saving=Saving(False, "gather_trainable", "local_rows", "adapter_file", False, None),
        generating=GenerationSpec(rewards=(), reference=reference, synced=False),
    )
    assert trainer.beta == 0.04 and trainer.args.beta == 0.04 and trainer.ref_model is None
    assert ("ref" in trainer.model.peft_config) == (reference == "ref_adapter")


def test_vllm_gets_the_adapter_alone_and_the_newest_request(tmp_path, tok, monkeypatch) -> None:
    """By reading (no vLLM here): the engine is started with LoRA on at the adapter's rank, each sync writes the
    gathered adapter (PEFT's layout, loadable) into this rank's folder, and generate() carries that step's request;
    before the first sync it refuses to generate from a stale engine."""
    import trl.generation.vllm_generation as module
    from peft import PeftModel

    from fsdp_tune.worker.training.vllm_sync import AdapterSync, lora_engine

    made = []
    monkeypatch.setattr(module, "LLM", lambda **kw: made.append(kw), raising=False)
    with lora_engine(12):
        module.LLM(model="m")
    assert made == [{"model": "m", "enable_lora": True, "max_lora_rank": 16, "max_loras": 1}]
    llm = SimpleNamespace(calls=[], resets=0)
    llm.generate = lambda prompts, **kw: llm.calls.append(kw) or ["out"]
    llm.reset_prefix_cache = lambda: setattr(llm, "resets", llm.resets + 1)
    model = _tiny_peft(tok)
    trainer = SimpleNamespace(
        model=model, model_wrapped=None, state=SimpleNamespace(global_step=3),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
    )  # fmt: skip
    generation = SimpleNamespace(llm=llm)
    sync = AdapterSync(trainer, generation, str(tmp_path), make_request=lambda *a: a)
    with pytest.raises(RuntimeError, match="before the adapter reached it"):
        llm.generate(["p"])
    generation.sync_weights()  # what TRL calls when the step changed
    folder = tmp_path / "fsdp_tune_vllm_adapter" / "rank-0" / "step-3"
    assert llm.generate(["p"]) == ["out"] and llm.calls[-1]["lora_request"] == ("policy-step-3", 4, str(folder))
    assert llm.resets == 1 and sync.folder == folder
    PeftModel.from_pretrained(_tiny_peft(tok).get_base_model(), str(folder))  # a PEFT adapter, whole
    trainer.state.global_step = 4
    generation.sync_weights()
    assert not folder.exists() and llm.calls == [llm.calls[0]] and sync.request[1] == 5


def test_the_plan_has_the_generation_and_the_log_prob_passes() -> None:
    """GRPO's phases before the training step (planner/generating.py): the KV cache of every completion generated at
    once, the reference's pass when beta > 0; the step time counts the generation's all-gathers: one per token on the
    sharded path, one per generation where the weights are gathered."""
    from fsdp_tune.planner import generating as planned_grpo
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.validate import check

    flags = ["--model_name_or_path", "meta-llama/Meta-Llama-3-8B", "--num_processes", "8", "--use_cpu", "false"]
    flags += ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_seq_len", "2048"]
    flags += ["--max_completion_length", "1024"]
    cfg = check(RECIPE, [*flags, "--beta", "0.04"]).config
    assert planned_grpo.rows_generated(cfg) == 4 and planned_grpo.log_prob_passes(cfg) == 1
    kv = 2 * 32 * 4 * 2048 * 1024 * 2  # layers, rows, tokens, key/value width (8 heads x 128), bf16
    plan = memory_plan(cfg, "h100")
    assert plan["phases_gib"][planned_grpo.GENERATION] > kv / 2**30 > 0.9
    assert planned_grpo.LOG_PROBS in plan["phases_gib"]
    without = check(RECIPE, flags).config
    assert planned_grpo.log_prob_passes(without) == 0
    assert planned_grpo.LOG_PROBS not in memory_plan(without, "h100")["phases_gib"]
    # 8B fits gathered on an H100 (planner/generating.py generation_weights): one all-gather per generation
    assert plan["step_time"]["comm_gb_per_step_per_gpu"] < 100
    sharded = check(RECIPE, [*flags, "--beta", "0.04", "--grpo_generation", "sharded"]).config
    comm = memory_plan(sharded, "h100")["step_time"]["comm_gb_per_step_per_gpu"]
    assert comm > 1000  # today's path: ~1025 forwards' all-gathers of 8B a generation
