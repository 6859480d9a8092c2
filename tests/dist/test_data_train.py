"""Training on the data users bring, as `train` runs it (runs of the session's group launches, tests/dist/conftest.py):
one 2-rank run on a mixture of every format from every kind of source (each dataset with its own format), evaluated
on held-out rows with the best checkpoint kept; and the proof that the loss is on the answers: random prompts and one
constant answer."""

from __future__ import annotations

import json

import pytest


def test_mixture_of_every_format_and_source_with_eval(variants) -> None:
    """Nine datasets, each with its own format and kind of source, packed, evaluated on held-out rows, the best
    checkpoint kept (tests/dist/conftest.py `mixture`, a run of the `variants` group)."""
    run = variants["mixture"]
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
    console = run.console
    assert "dataset: acme/qa [train[:10]]: format detected on rank 0 (a Hub dataset)" in console
    assert "  packing: bfd, best-fit decreasing" in console and "weight 1 (unset)" in console
    assert f"data: packed (bfd): 145 sequences -> {packed['rows']} rows of up to 96 tokens" in console
    assert "data: acme/qa [train[:10]]: sharegpt" in console and "loss on " in console


def test_the_loss_is_on_the_answers(one_rank) -> None:
    """Full fine-tuning on random prompts and one constant answer (tests/dist/conftest.py `one_rank`): on the
    answers only, the answer is learned; on everything (--train_on_inputs), the random prompts are not."""
    answers, everything = one_rank["answers"].summary, one_rank["everything"].summary
    assert answers["data"]["loss_share"] < 0.5 and everything["data"]["loss_share"] == 1.0
    assert answers["loss_last"] < 0.15, answers["losses"]  # the constant answer is learned
    assert everything["loss_last"] > 1.0, everything["losses"]  # the random prompts are not learnable
