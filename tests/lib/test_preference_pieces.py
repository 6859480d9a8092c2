"""Preference methods' pieces in one process: rank 0's conversion of preference data (KTO's rows unpaired and
shuffled with the seed, skipped rows counted, prepared once), the reference adapter and a starting adapter on a
PEFT model before sharding, and the memory plan of each method's step."""

from __future__ import annotations

import pytest

from fsdp_tune.output.plan import format_plan
from tests.conftest import FIXTURES
from tests.datafiles import jsonl

BASE = str(FIXTURES / "tiny_lora.yaml")


@pytest.fixture(scope="module")
def tok():
    from fsdp_tune.models.tiny import build_tokenizer

    return build_tokenizer(512)


def planned(tmp_path, *flags: str, config: str = BASE):
    from fsdp_tune.launch.train import plan_run

    return plan_run(config, ["--output_dir", str(tmp_path / "run"), *flags], print).spec


def test_kto_rows_from_pairs_and_unpaired_rows_prepared_once_and_shuffled(tmp_path, tok, monkeypatch) -> None:
    from fsdp_tune.worker.data import preference

    pairs = [{"prompt": f"Q{i}:", "chosen": " good", "rejected": " bad"} for i in range(6)]
    pairs[2]["rejected"] = " good"  # identical: skipped and named
    unpaired = [{"prompt": f"U{i}:", "completion": " fine", "label": i % 2 == 0} for i in range(4)]
    a, b = jsonl(tmp_path / "pairs.jsonl", pairs), jsonl(tmp_path / "kto.jsonl", unpaired)
    recipe = tmp_path / "r.yaml"
    base = (FIXTURES / "tiny_lora.yaml").read_text().replace("  dataset_name: builtin:demo-chat\n", "")
    recipe.write_text(base + f"datasets:\n  - path: {a}\n  - path: {b}\n")
    spec = planned(tmp_path, "--method", "kto", "--dataset_name", str(a))
    spec2 = planned(tmp_path / "m", "--method", "kto", config=str(recipe))
    for s in (spec, spec2):
        monkeypatch.setenv("LOCAL_RANK", "1")
        with pytest.raises(RuntimeError, match="rank 0 did not prepare the data"):
            preference.prepare_preference(s, tok)
    monkeypatch.setenv("LOCAL_RANK", "0")
    one = preference.prepare_preference(spec, tok)
    assert sorted(one.train.column_names) == ["completion", "label", "prompt"] and len(one.train) == 10
    skipped = one.report["sources"][0]["skipped"]
    assert skipped == {"chosen and rejected are the same: nothing to prefer": {"count": 1, "rows": [f"{a} row 3"]}}
    labels = one.train["label"]
    assert labels.count(True) == 5 and labels != sorted(labels, reverse=True)  # shuffled: not all desirable first
    q0 = sorted((r["completion"], r["label"]) for r in one.train if r["prompt"] == "Q0:")
    assert q0 == [(" bad", False), (" good", True)]  # a pair: its chosen answer desirable, its rejected one not
    mixed = preference.prepare_preference(spec2, tok)
    assert len(mixed.train) == 14 and [s["kind"] for s in mixed.report["sources"]] == ["preference", "unpaired"]
    monkeypatch.setattr(preference, "build", lambda *a: pytest.fail("prepared twice"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert preference.prepare_preference(spec, tok).train["prompt"] == one.train["prompt"]  # the same order


def test_a_split_with_no_pair_left_is_refused_with_the_reasons(tmp_path, tok, monkeypatch) -> None:
    from fsdp_tune.worker.data.preference import prepare_preference

    data = jsonl(tmp_path / "same.jsonl", [{"prompt": "Q:", "chosen": " a", "rejected": " a"}] * 2)
    spec = planned(tmp_path, "--method", "dpo", "--dataset_name", str(data))
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError) as refused:
        prepare_preference(spec, tok)
    assert str(refused.value) == (
        f"{data} [train]: no row of the train split can be trained on "
        "(2 row(s): chosen and rejected are the same: nothing to prefer)"
    )


def test_dpo_pairs_keep_trl_columns_and_a_margin(tmp_path, tok, monkeypatch) -> None:
    from fsdp_tune.worker.data.preference import prepare_preference

    rows = [{"prompt": "p", "response_0": "a", "response_1": "b", "better_response_id": i % 2} for i in range(4)]
    spec = planned(tmp_path, "--method", "reward", "--dataset_name", str(jsonl(tmp_path / "pku.jsonl", rows)))
    monkeypatch.setenv("LOCAL_RANK", "0")
    got = prepare_preference(spec, tok)
    assert (
        got.train.to_list()
        == [
            {"prompt": "p", "chosen": "a", "rejected": "b"},
            {"prompt": "p", "chosen": "b", "rejected": "a"},
        ]
        * 2
    )


def tiny_peft(r: int = 4):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
    )  # fmt: skip
    return get_peft_model(LlamaForCausalLM(config), LoraConfig(r=r, target_modules="all-linear", task_type="CAUSAL_LM"))


def test_reference_adapter_and_starting_adapter(tmp_path) -> None:
    import torch
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    from fsdp_tune.worker.loading.reference import add_reference_adapter, load_start_adapter, reset_to_base

    trained = {k: torch.full_like(v, 0.25) for k, v in get_peft_model_state_dict(tiny_peft()).items()}
    save_file(trained, str(tmp_path / "adapter_model.safetensors"))
    model = tiny_peft()
    assert load_start_adapter(model, str(tmp_path)) == len(trained)
    assert all(p.eq(0.25).all() for n, p in model.named_parameters() if ".default." in n)
    for name, p in model.named_parameters():
        if ".default." in name:
            p.data = p.data.to(torch.bfloat16)  # as SFTTrainer casts a 4-bit model's adapters
    rng = torch.get_rng_state()
    add_reference_adapter(model)
    assert torch.equal(rng, torch.get_rng_state())  # the reference draws nothing: LoRA's draws stay in place
    ref = {n: p for n, p in model.named_parameters() if ".ref." in n}
    assert len(ref) == len(trained) and not any(p.requires_grad for p in ref.values())
    assert {p.dtype for p in ref.values()} == {torch.bfloat16}  # the default adapter's dtype: one per FSDP unit
    assert model.add_adapter("ref", model.peft_config["default"]) is None  # TRL's call: kept as made
    assert reset_to_base(model) == len(trained) // 2
    assert all(p.eq(0).all() for n, p in ref.items() if ".lora_B." in n)
    assert all(p.eq(0.25).all() for n, p in model.named_parameters() if ".default." in n)
    with pytest.raises(RuntimeError, match="does not fit this model's LoRA"):
        load_start_adapter(tiny_peft(r=8), str(tmp_path))


def test_plan_of_each_method(tmp_path) -> None:
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.validate import check

    flags = ["--model_name_or_path", "meta-llama/Llama-2-7b-hf", "--use_peft_lora", "--num_processes", "8"]
    flags += ["--max_seq_len", "2048", "--per_device_train_batch_size", "4", "--gradient_checkpointing", "false"]

    def plan(method: str) -> dict:
        return memory_plan(check(None, [*flags, "--method", method]).config, "h100")

    sft, dpo, kto, reward = (plan(m) for m in ("sft", "dpo", "kto", "reward"))
    assert dpo["per_gpu_memory_gib"] > reward["per_gpu_memory_gib"] > kto["per_gpu_memory_gib"]
    assert kto["per_gpu_memory_gib"] > sft["per_gpu_memory_gib"]  # its no-grad forwards beside the kept activations
    assert dpo["step_time"]["step_s"] > 2 * sft["step_time"]["step_s"]  # 2B rows and a reference forward on them
    assert (
        "reference forward (no grad)" in dpo["phases_gib"] and "reference forward (no grad)" not in reward["phases_gib"]
    )
    assert format_plan(dpo).startswith("method: DPO") and format_plan(sft).startswith("model:")
    assert any(n.startswith("dpo: 2 sequences per example") for n in dpo["notes"])
