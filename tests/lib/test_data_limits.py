"""Data that used to crash rank 0 or keep it busy (#25 "Also", #26 items 8 and 10), with the libraries in one
process: rows tokenized on the launcher before launch (rows whose prompt fills max_seq_len counted, nothing left
refused: PF070; rows far longer than max_seq_len named: PF071), without importing torch; on rank 0 an
assistant-first conversation trains, CSV answers that are numbers stay text, "nothing left" is said with the
reasons instead of an IndexError or the Trainer's missing eval_dataset, and rows far longer than max_seq_len are
cut before rendering (the tokens kept are those the whole row gives) or, where nothing may be cut, skipped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_tune.sources.encode import Encoder
from tests.conftest import FIXTURES, REPO
from tests.datafiles import jsonl

BASE = str(FIXTURES / "tiny_lora.yaml")  # max_seq_len 96, the builtin ChatML tokenizer
LONG = {"instruction": "word " * 200, "input": "", "output": "short"}  # the prompt alone fills 96 tokens
QA = [{"instruction": f"Add {i} and 1.", "input": "", "output": f"It is {i + 1}."} for i in range(6)]


@pytest.fixture(scope="module")
def tok():
    from fsdp_tune.models.tiny import build_tokenizer

    return build_tokenizer(512)


def planned(tmp_path: Path, *flags: str, config: str = BASE):
    from fsdp_tune.launch.train import plan_run

    return plan_run(config, ["--output_dir", str(tmp_path / "run"), *flags], print)


def found(plan, rule: str) -> list:
    return [f for f in plan.machine_findings if f.rule == rule]


def rank0(plan, tok):
    """Rank 0's preparation of the planned spec, whatever the pre-flight said (the rank's own guard)."""
    from fsdp_tune.worker.data.prepare import prepare

    return prepare(plan.spec, tok)


def answers(tok, dataset) -> list[list[str]]:
    out = []
    for r in dataset:
        runs, run = [], []
        for t, m in zip([*r["input_ids"], None], [*r["assistant_masks"], 0], strict=True):
            if m:
                run.append(t)
            elif run:
                runs.append(tok.decode(run))
                run = []
        out.append(runs)
    return out


# ---------------------------------------------------------------- before launch


def test_rows_whose_prompt_fills_max_seq_len_are_counted_before_launch(tmp_path) -> None:
    data = jsonl(tmp_path / "a.jsonl", [LONG] * 3)
    plan = planned(tmp_path, "--dataset_name", str(data))
    (refusal,) = found(plan, "PF070")
    assert refusal.severity.value == "error" and refusal.source == f"{data}:1"
    assert "no row of the train split is left once tokenized (every row tokenized here)" in refusal.message
    assert "3: the prompt fills max_seq_len" in refusal.message and "--max_seq_len" in refusal.hint
    some = jsonl(tmp_path / "b.jsonl", [*QA, LONG])
    plan = planned(tmp_path, "--dataset_name", str(some))
    (warning,) = found(plan, "PF070")
    assert warning.severity.value == "warning" and warning.source == f"{some}:7"
    (counted,) = plan.counted  # beside the spec: the ranks read none of it
    assert counted.tokenized == {"rows": 7, "of": 7, "skipped": 1} and counted.rows_checked == 6


def test_a_held_out_split_with_nothing_left_is_refused(tmp_path) -> None:
    jsonl(tmp_path / "d" / "train.jsonl", QA)
    jsonl(tmp_path / "d" / "test.jsonl", [LONG] * 2)
    plan = planned(
        tmp_path, "--dataset_name", str(tmp_path / "d"), "--splits", "train,test", "--eval_strategy", "steps"
    )
    assert [(f.key, f.severity.value) for f in found(plan, "PF070")] == [("test", "error")]


def test_rows_that_would_stop_rank_0_are_refused_before_launch(tmp_path, tok, monkeypatch) -> None:
    """--mask_fallback error on a template that re-renders earlier turns (Qwen3's): rank 0 would raise."""
    import copy

    import trl

    from fsdp_tune.preflight import tokens as tokencheck

    qwen3 = copy.deepcopy(tok)
    qwen3.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    qwen3.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    monkeypatch.setattr(tokencheck, "load_tokenizer", lambda model: (qwen3, ""))
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."}]
    chat += [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6."}]
    data = jsonl(tmp_path / "a.jsonl", [{"messages": chat[:2]}, {"messages": chat}])
    (refusal,) = found(planned(tmp_path, "--dataset_name", str(data), "--mask_fallback", "error"), "PF070")
    assert refusal.severity.value == "error" and refusal.source == f"{data}:2"
    assert "1 row(s) would stop rank 0" in refusal.message and "InconsistentTemplate" in refusal.message
    assert refusal.hint.startswith("--mask_fallback split")
    assert not found(planned(tmp_path, "--dataset_name", str(data)), "PF070")  # split, the default: trained


def test_the_launcher_tokenizes_without_torch(tmp_path) -> None:
    data = jsonl(tmp_path / "a.jsonl", [*QA, LONG])
    script = (
        "import sys\nfrom fsdp_tune.launch.train import plan_run\n"
        f"p = plan_run({BASE!r}, ['--output_dir', {str(tmp_path / 'o')!r}, '--dataset_name', {str(data)!r}], print)\n"
        "print(p.counted[0].tokenized, [m for m in ('torch', 'datasets') if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.splitlines()[-1] == "{'rows': 7, 'of': 7, 'skipped': 1} []", out.stdout + out.stderr


# ---------------------------------------------------------------- rank 0


def test_an_assistant_first_conversation_is_trained(tmp_path, tok) -> None:
    greeting = {"role": "assistant", "content": "Hello, how can I help?"}
    chat = [greeting, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    plan = planned(tmp_path, "--dataset_name", str(jsonl(tmp_path / "a.jsonl", [{"messages": chat}] * 2)))
    assert [f.rule for f in plan.machine_findings if f.severity.value == "error"] == []
    p = rank0(plan, tok)
    assert answers(tok, p.train)[0] == ["Hello, how can I help?<|im_end|>", "4<|im_end|>"]


def test_csv_answers_that_are_numbers_stay_text(tmp_path, tok) -> None:
    data = tmp_path / "sums.csv"
    data.write_text("prompt,completion\n" + "".join(f"What is {i} plus 1?,{i + 1}\n" for i in range(5)) + "NA?,NA\n")
    p = rank0(planned(tmp_path, "--dataset_name", str(data)), tok)
    assert len(p.train) == 6 and p.report["sources"][0]["skipped"] == {}
    assert answers(tok, p.train)[1] == ["2<|im_end|>"] and answers(tok, p.train)[5] == ["NA<|im_end|>"]


def test_nothing_left_is_said_with_the_reasons(tmp_path, tok) -> None:
    from fsdp_tune.worker.data.prepare import NothingLeft

    data = jsonl(tmp_path / "a.jsonl", [LONG] * 2)
    with pytest.raises(NothingLeft, match=r"no training row is left: .* 2 row\(s\) skipped, the prompt fills max_seq"):
        rank0(planned(tmp_path, "--dataset_name", str(data)), tok)
    jsonl(tmp_path / "d" / "train.jsonl", QA)
    jsonl(tmp_path / "d" / "test.jsonl", [{**QA[0], "output": ""}, LONG])
    flags = ["--dataset_name", str(tmp_path / "d"), "--splits", "train,test", "--eval_strategy", "steps"]
    with pytest.raises(NothingLeft, match=r"no held-out row is left for --eval_strategy: .*an empty answer.*fills"):
        rank0(planned(tmp_path / "e", *flags), tok)


# ---------------------------------------------------------------- rows far longer than max_seq_len


def _chat(turns: int) -> dict:
    return {
        "messages": [{"role": ("user", "assistant")[i % 2], "content": f"turn {i} says hello"} for i in range(turns)]
    }


def test_turns_past_max_seq_lens_reach_are_never_rendered(tmp_path, tok, monkeypatch) -> None:
    rendered: list[int] = []
    original = type(tok).apply_chat_template

    def counting(self, conversation, *args, **kwargs):
        rendered.append(len(conversation))
        return original(self, conversation, *args, **kwargs)

    monkeypatch.setattr(type(tok), "apply_chat_template", counting)
    data = jsonl(tmp_path / "a.jsonl", [_chat(2000), *[_chat(2)] * 3])
    plan = planned(tmp_path, "--dataset_name", str(data))
    p = rank0(plan, tok)
    assert max(rendered) < 200  # of 2,000 turns (the launcher's own tokenizer is another object)
    assert len(p.train[0]["input_ids"]) == 96 and p.report["sources"][0]["clipped"]["rows"] == [f"{data} row 1"]
    (note,) = found(plan, "PF071")
    assert note.severity.value == "note" and note.source == f"{data}:1" and "only the text within" in note.message


@pytest.mark.parametrize(
    "row",
    [
        _chat(400),
        {"text": "many words " * 3000},
        {"prompt": "many words " * 3000, "completion": " yes"},
        {"prompt": "q " * 10, "completion": " many words" * 3000},
    ],
    ids=["messages", "text", "prompt", "completion"],
)
def test_cutting_before_rendering_keeps_the_tokens_the_whole_row_gives(tok, row) -> None:
    from fsdp_tune.sources.formats import detect_format
    from fsdp_tune.sources.rows import encode_row

    fmt = detect_format(row.keys(), [row])
    cut = Encoder(tok, 96)

    class Whole(Encoder):
        reach = None  # nothing cut before rendering

    skip, sequences = encode_row(row, fmt, {}, cut, train_all=False)
    whole_skip, whole = encode_row(row, fmt, {}, Whole(tok, 96), train_all=False)
    assert (skip, [(s.input_ids, s.mask) for s in sequences]) == (whole_skip, [(s.input_ids, s.mask) for s in whole])
    assert all(s.clipped for s in sequences) and (sequences or skip == "too-long")


def test_rows_that_cannot_be_cut_are_bounded_and_named(tmp_path, tok) -> None:
    huge = {"text": "many words " * 300_000}  # 3.3 MB: over 64 x 96 tokens' worth of the longest token
    data = jsonl(tmp_path / "a.jsonl", [huge, *[{"text": "a few words"}] * 3])
    plan = planned(tmp_path, "--dataset_name", str(data), "--packing", "True", "--packing_strategy", "wrapped")
    (warning,) = found(plan, "PF071")
    assert warning.severity.value == "warning" and warning.source == f"{data}:1" and "too large" in warning.message
    p = rank0(plan, tok)
    (reason,) = p.report["sources"][0]["skipped"]
    assert reason.startswith("far longer than max_seq_len and it cannot be cut")
    assert p.report["sources"][0]["skipped"][reason]["rows"] == [f"{data} row 1"] and len(p.train) == 3
