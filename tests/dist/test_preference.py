"""Preference tuning on 2 CPU ranks, every method in the session's `continued` launch (tests/dist/conftest.py
preference_runs; the rank specs come from the launcher's own plan_run): DPO on a preference probe (random prompts,
one constant preferred and one constant rejected answer), from plain pairs and from conversations whose prompt is
their common turns; KTO on unpaired rows; a reward model, scored on held-out prompts, merged into a sequence
classifier; and DPO continuing the reference run's SFT adapter, which is both the policy's start and the
reference."""

from __future__ import annotations

import json
from pathlib import Path

from tests.dist.conftest import BAD, GOOD, Member, prompts

PREFERENCE = ("dpo", "dpo-chats", "kto", "reward", "from-sft")


def test_dpo_kto_reward_and_dpo_from_an_sft_run(tmp_path, reference_run, continued) -> None:
    group, runs = continued, PREFERENCE
    sft = reference_run.output_dir  # LoRA r 8 on all linears, 6 SFT steps on the demo chats
    assert [group[n].spec.loading.path for n in runs] == ["sharded", "sharded", "sharded", "transformers", "sharded"]
    assert group["from-sft"].spec.model.adapter == str(sft) and group["from-sft"].spec.lora.r == 8
    assert group.proc.returncode == 0, group.logs() + "".join(group[n].logs() for n in runs)
    shown = {n: (group[n].output_dir / "logs" / "rank-0.log").read_text() for n in ("dpo", "kto", "reward")}
    for name, said in (("dpo", "  reward acc 1.00  margin "), ("kto", "  kl "), ("reward", "  acc 1.00  margin ")):
        assert "fsdp-tune: step 10/10  loss " in shown[name] and said in shown[name], name  # the progress line

    for name in ("dpo", "dpo-chats"):
        s = group[name].summary
        metrics = s["method_metrics"]
        assert s["method"] == "dpo" and s["adapter_check"]["ok"] and s["adapter_check"]["lora_tensors"] == 56, s
        assert metrics["rewards/accuracies"]["last"] >= 0.9 and metrics["rewards/margins"]["last"] > 0, metrics
        assert metrics["rewards/margins"]["first"] == 0  # step 1: the policy is its reference (a fresh adapter)
    kinds = {n: group[n].summary["data"]["sources"][0] for n in ("dpo", "dpo-chats", "kto")}
    assert [kinds[n]["kind"] for n in kinds] == ["preference", "preference_implicit", "unpaired"]
    assert "(conversational)" in kinds["dpo-chats"]["format"]

    kto = group["kto"].summary
    assert kto["loss_last"] < kto["loss_first"] and kto["method_metrics"]["rewards/margins"]["last"] > 0, kto
    assert "kl" in kto["method_metrics"] and kto["adapter_check"]["ok"]

    _check_reward_model(group["reward"], tmp_path)
    _check_the_start_and_the_reference(group["from-sft"], sft)


def _scores(model, tok, texts: list[str]) -> list[float]:
    import torch

    with torch.no_grad():
        return [model(**tok(t, return_tensors="pt")).logits[0, 0].item() for t in texts]


def _check_reward_model(member: Member, tmp_path: Path) -> None:
    """The reward model scores the preferred answer higher on prompts it never saw; merged, it is a sequence
    classifier that scores the same."""
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from fsdp_tune.tools.merge import merge

    s, run = member.summary, member.output_dir
    assert s["method"] == "reward" and s["adapter_check"]["ok"] and s["method_metrics"]["accuracy"]["last"] >= 0.9, s
    config = json.loads((run / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and "score" in config["modules_to_save"]
    tok = AutoTokenizer.from_pretrained(str(run))
    base = AutoModelForSequenceClassification.from_pretrained(config["base_model_name_or_path"], num_labels=1)
    base.config.pad_token_id = tok.pad_token_id
    model = PeftModel.from_pretrained(base, str(run)).eval()
    held = [f"Question: {p}\nAnswer:" for p in prompts(12, 99)]
    end = tok.eos_token  # TRL appends it to every text answer: the score is read there
    good, bad = (_scores(model, tok, [f"{p} {a}{end}" for p in held]) for a in (GOOD, BAD))
    assert all(g > b for g, b in zip(good, bad, strict=True)), (good, bad)
    merged = merge(str(run), None, str(tmp_path / "rm-merged"), None, "5GB", "cpu", False)
    assert merged["max_rel_logit_diff"] <= merged["tolerance"]
    classifier = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "rm-merged")).eval()
    assert type(classifier).__name__ == "LlamaForSequenceClassification"
    again = _scores(classifier, tok, [f"{p} {GOOD}{end}" for p in held])
    assert max(abs(a - g) for a, g in zip(again, good, strict=True)) < 1e-4


def _check_the_start_and_the_reference(member: Member, sft: Path) -> None:
    """DPO from the SFT adapter: at step 1 the policy equals its reference (both the SFT adapter); the saved adapter
    is the policy, a few small steps away from the SFT adapter (not from a fresh one), and holds no reference."""
    from safetensors.torch import load_file

    s, run = member.summary, member.output_dir
    assert s["adapter_check"]["ok"] and s["method_metrics"]["rewards/margins"]["first"] == 0, s
    start, end = load_file(str(sft / "adapter_model.safetensors")), load_file(str(run / "adapter_model.safetensors"))
    assert end.keys() == start.keys() and not any(".ref." in k for k in end)
    b = [k for k in start if "lora_B" in k]
    moved = sum((end[k] - start[k]).norm().item() ** 2 for k in b) ** 0.5
    size = sum(start[k].norm().item() ** 2 for k in b) ** 0.5
    assert size > 0 and 0 < moved < 0.5 * size, (moved, size)  # a fresh start would be `size` away from it
