"""Training on the data users bring, through the CLI: one 2-rank run on a mixture of every format from every
kind of source (each dataset with its own format), evaluated on held-out rows with the best checkpoint kept;
and the proof that the loss is on the answers: random prompts and one constant answer."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from tests.datafiles import hub_cache, jsonl
from tests.dist.conftest import BASE


def _qa(i: int) -> tuple[str, str]:
    return f"What is {i} plus 1?", f"{i} plus 1 is {i + 1}."


def _sources(root: Path) -> list[dict]:
    """Nine datasets, five formats, every kind of local source and a Hub dataset from the offline cache."""
    import datasets

    root.mkdir(parents=True)
    q = [_qa(i) for i in range(40)]
    alpaca = [{"instruction": p, "input": "", "output": a} for p, a in q]
    sharegpt = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]} for p, a in q]
    messages = [
        {"messages": json.dumps([{"role": "user", "content": p}, {"role": "assistant", "content": a}])} for p, a in q
    ]
    chat_pc = [
        {"prompt": [{"role": "user", "content": p}], "completion": [{"role": "assistant", "content": a}]} for p, a in q
    ]
    plain_pc = [{"prompt": p, "completion": " " + a} for p, a in q]
    text = [{"text": f"{p} {a}"} for p, a in q]
    (root / "sharegpt.json").write_text(json.dumps(sharegpt))  # a JSON array
    datasets.Dataset.from_list(messages).to_csv(str(root / "messages.csv"), index=False)  # JSON text in cells
    datasets.Dataset.from_list(chat_pc).to_parquet(str(root / "chat_pc.parquet"))
    datasets.Dataset.from_list(text).save_to_disk(str(root / "text_saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(plain_pc)}).save_to_disk(str(root / "pc_dict"))
    jsonl(root / "shards" / "part-0.jsonl", alpaca[:20])
    jsonl(root / "shards" / "part-1.jsonl", alpaca[20:])
    hub_cache(root / "hub", "acme/qa", "default", {"train": jsonl(root / "hub.jsonl", sharegpt)})
    return [
        {"path": str(jsonl(root / "alpaca.jsonl", alpaca)), "samples": 12},
        {"path": str(root / "sharegpt.json"), "weight": 1},
        {"path": str(root / "messages.csv"), "weight": 1},
        {"path": str(root / "chat_pc.parquet"), "split": "train[:50%]"},
        {"path": str(next((root / "text_saved").glob("*.arrow")))},  # an Arrow file
        {"path": str(root / "pc_dict"), "samples": 8},  # a save_to_disk folder
        {"path": str(root / "shards"), "samples": 8},  # a folder of files
        {"path": "json", "data_files": str(root / "shards" / "*.jsonl"), "samples": 4, "format": "alpaca"},
        {"path": "acme/qa", "split": "train[:10]"},  # the Hub, offline, from datasets' cache
    ]


def test_mixture_of_every_format_and_source_with_eval(train, tmp_path) -> None:
    config = yaml.safe_load(BASE.read_text())
    data = {k: v for k, v in config["data"].items() if k != "dataset_name"}
    config["data"] = data | {"test_split_size": 0.2, "packing": True}  # masks go through TRL's BFD packing
    config["datasets"] = _sources(tmp_path / "data")
    config["training"].update(
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        per_device_eval_batch_size=8,
    )
    recipe = tmp_path / "mixture.yaml"
    recipe.write_text(yaml.safe_dump(config))
    run = train(config=recipe, env={"HF_DATASETS_CACHE": str(tmp_path / "data" / "hub")})
    data = run.summary["data"]
    kinds = [s["kind"] for s in data["sources"]]
    assert kinds == ["alpaca", "sharegpt", "messages", "prompt_completion", "text"] + ["prompt_completion"] + [
        "alpaca"
    ] * 2 + ["sharegpt"]
    assert [s["loss"] for s in data["sources"]] == ["answers"] * 4 + ["all"] + ["answers"] * 4
    # weight 1 on two entries: the entries without a share weigh 1 too (#25), so the 150 rows of those five split
    # evenly; samples stay exact
    assert [s["used"] for s in data["sources"]] == [12, 30, 30, 30, 30, 8, 8, 4, 30]
    packed = data["packed"]  # #25: packing is counted, not "N rows -> N sequences" alone
    assert packed["strategy"] == "bfd" and packed["sequences"] == data["sequences"] == 145, packed
    assert 0 < packed["rows"] < 145
    assert 0 < data["loss_share"] < 1 and 0 < data["eval"]["loss_tokens"] < data["eval"]["tokens"]  # answers only
    eval_losses = [
        json.loads(x)["eval_loss"]
        for x in (run.output_dir / "metrics.jsonl").read_text().splitlines()
        if "eval_loss" in x
    ]
    assert len(eval_losses) == 2
    state = json.loads((run.output_dir / "trainer_state.json").read_text())
    assert state["best_metric"] == pytest.approx(min(eval_losses)) and state["best_model_checkpoint"]
    console = run.proc.stdout
    assert "dataset: acme/qa [train[:10]]: format detected on rank 0 (a Hub dataset)" in console
    assert "  packing: bfd, best-fit decreasing" in console and "weight 1 (unset)" in console
    assert f"data: packed (bfd): 145 sequences -> {packed['rows']} rows of up to 96 tokens" in console
    assert "data: acme/qa [train[:10]]: sharegpt" in console and "loss on " in console


def _constant_answer(path: Path) -> Path:
    """Random numbers as the prompt, one constant answer: only the answer can be learned."""
    rnd = random.Random(0)
    rows = []
    for _ in range(320):
        prompt = " ".join(str(rnd.randint(0, 999)) for _ in range(rnd.randint(6, 12)))
        rows.append(
            {
                "conversations": [
                    {"from": "human", "value": prompt},
                    {"from": "gpt", "value": "The answer is always the same."},
                ]
            }
        )
    return jsonl(path, rows)


def test_the_loss_is_on_the_answers(train, tmp_path) -> None:
    data = _constant_answer(tmp_path / "constant.jsonl")
    flags = ["--dataset_name", str(data), "--num_processes", "1", "--use_peft_lora", "false", "--max_steps", "40"]
    flags += ["--per_device_train_batch_size", "8", "--learning_rate", "0.003", "--lr_scheduler_type", "constant"]
    flags += ["--logging_steps", "5"]
    answers = train(*flags, output_dir=tmp_path / "answers").summary
    everything = train(*flags, "--train_on_inputs", output_dir=tmp_path / "all").summary  # axolotl's spelling
    assert answers["data"]["loss_share"] < 0.5 and everything["data"]["loss_share"] == 1.0
    assert answers["loss_last"] < 0.15, answers["losses"]  # the constant answer is learned
    assert everything["loss_last"] > 1.0, everything["losses"]  # the random prompts are not learnable
