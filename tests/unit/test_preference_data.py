"""Preference data, without `datasets` or torch: every shape is detected from its columns (sources/preference.py),
converted to TRL's columns with the prompt cut at a turn or a word (sources/preference_rows.py), and checked before
launch for the method that trains on it (sources/preference_check.py through preflight/data.py settle)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_tune.errors import Severity
from fsdp_tune.preflight.data import settle
from fsdp_tune.sources.formats import PREFERENCE_FIELDS, FormatError
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.preference import detect_preference
from fsdp_tune.sources.preference_rows import canonical, split_text, split_turns, unpair


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def bot(text: str) -> dict:
    return {"role": "assistant", "content": text}


# one row per shape README.md's "Preference tuning" table names, with the format it is read as
SHAPES = {
    "explicit text": ({"prompt": "2+2?", "chosen": " 4", "rejected": " 5"}, "preference", False),
    "explicit conversational": (
        {"prompt": [user("2+2?")], "chosen": [bot("4")], "rejected": [bot("5")]},
        "preference",
        True,
    ),
    "Anthropic HH (implicit text)": (
        {"chosen": "\n\nHuman: 2+2?\n\nAssistant: The answer is 4", "rejected": "\n\nHuman: 2+2?\n\nAssistant: 5"},
        "preference_implicit",
        False,
    ),
    "implicit conversational": (
        {"chosen": [user("2+2?"), bot("4")], "rejected": [user("2+2?"), bot("5")]},
        "preference_implicit",
        True,
    ),
    "UltraFeedback binarized": (
        {
            "prompt": "2+2?",
            "prompt_id": "x",
            "messages": [user("2+2?"), bot("4")],
            "chosen": [user("2+2?"), bot("4")],
            "rejected": [user("2+2?"), bot("5")],
            "score_chosen": 9.0,
            "score_rejected": 2.0,
        },
        "preference_implicit",
        True,
    ),
    "KTO unpaired": ({"prompt": "2+2?", "completion": " 4", "label": True}, "unpaired", False),
    "PKU-SafeRLHF": (
        {"prompt": "2+2?", "response_0": "5", "response_1": "4", "better_response_id": 1},
        "ranked",
        False,
    ),
    "arena winner": ({"prompt": "2+2?", "response_a": "4", "response_b": "5", "winner": "model_a"}, "ranked", False),
    "scored answers": (
        {"prompt": "2+2?", "response_a": "5", "response_b": "4", "score_a": 1, "score_b": 8},
        "ranked",
        False,
    ),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_is_detected_and_converted(shape: str) -> None:
    row, kind, conversational = SHAPES[shape]
    fmt = detect_preference(row.keys(), [row])
    assert (fmt.kind, fmt.conversational) == (kind, conversational)
    out, problem = canonical(row, fmt)
    assert problem is None, problem
    if kind == "unpaired":
        assert out == {"prompt": "2+2?", "completion": " 4", "label": True}
        return
    assert set(out) == {"prompt", "chosen", "rejected"}
    text = json.dumps(out)
    assert "4" in json.dumps(out["chosen"]) and "5" in json.dumps(out["rejected"]), text  # the better answer chosen
    assert ("2+2?" in json.dumps(out["prompt"])) and "2+2?" not in json.dumps(out["chosen"]), text
    if conversational:  # TRL's conversational pairs: the prompt's turns, then assistant turns only
        assert out["prompt"][-1]["role"] == "user" and out["chosen"][0]["role"] == "assistant", text


def test_an_implicit_prompt_is_cut_at_a_word_not_inside_one() -> None:
    # TRL's extract_prompt takes the common character prefix: prompt "w1 w2 w3 w", answers "7" and "8"
    assert split_text("w1 w2 w3 w7", "w1 w2 w3 w8") == ("w1 w2 w3", " w7", " w8")
    assert split_text("Q: x\nA: The cat", "Q: x\nA: They") == ("Q: x\nA:", " The cat", " They")
    assert split_text("Q: x\nA: yes", "Q: x\nA: yes, sure") == ("Q: x\nA:", " yes", " yes, sure")
    conversation = [user("a"), bot("b"), user("c")]
    assert split_turns([*conversation, bot("d")], [*conversation, bot("e")]) == (conversation, [bot("d")], [bot("e")])


@pytest.mark.parametrize(
    "row,code",
    [
        ({"prompt": "q", "chosen": " a", "rejected": " a"}, "identical"),
        ({"prompt": "q", "chosen": " ", "rejected": " a"}, "empty-chosen"),
        ({"prompt": "q", "chosen": " a", "rejected": None}, "missing"),
        ({"prompt": "q", "chosen": " a", "rejected": " b", "score_chosen": 3, "score_rejected": 3}, "tie"),
        ({"chosen": "yes", "rejected": "no"}, "no-prompt"),
        ({"prompt": "q", "response_a": "a", "response_b": "b", "winner": "tie (bothbad)"}, "tie"),
        ({"prompt": "q", "response_a": "a", "response_b": "b", "winner": "model_c"}, "no-preference"),
        ({"prompt": "q", "completion": "a", "label": "maybe"}, "bad-label"),
    ],
)
def test_rows_that_cannot_be_trained_on_say_why(row: dict, code: str) -> None:
    columns = {k: v for k, v in row.items() if v is not None}
    fmt = detect_preference(row.keys(), [columns])
    out, problem = canonical(row, fmt)
    assert out is None and problem.code == code and problem.skips


def test_labels_read_as_booleans_and_pairs_unpair_for_kto() -> None:
    fmt = detect_preference(["prompt", "completion", "label"], [{"prompt": "q", "completion": "a", "label": 1}])
    assert canonical({"prompt": "q", "completion": "a", "label": "false"}, fmt)[0]["label"] is False
    assert unpair({"prompt": "q", "chosen": "a", "rejected": "b"}) == [
        {"prompt": "q", "completion": "a", "label": True},
        {"prompt": "q", "completion": "b", "label": False},
    ]


def test_column_maps_and_refusals() -> None:
    rows = [{"question": "q", "good": "a", "bad": "b"}]
    fmt = detect_preference(
        rows[0].keys(), rows, column_map={"prompt": "question", "chosen": "good", "rejected": "bad"}
    )
    assert fmt.kind == "preference" and canonical(rows[0], fmt)[0] == {"prompt": "q", "chosen": "a", "rejected": "b"}
    with pytest.raises(FormatError, match="match no preference format"):
        detect_preference(["text"], [{"text": "hi"}])
    with pytest.raises(FormatError, match="supervised fine-tuning data"):
        detect_preference(["prompt", "chosen", "rejected"], [], forced="messages")
    assert {"chosen", "rejected", "label", "winner"} <= PREFERENCE_FIELDS  # --dataset_columns may name them


def jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def preflight(method: str, *paths: str):
    sources = tuple(Source(path=p) for p in paths)
    return settle(sources, "text", None, False, method=method)


def test_preflight_refuses_what_the_method_cannot_use_with_file_and_line(tmp_path) -> None:
    unpaired = jsonl(
        tmp_path / "kto.jsonl", [{"prompt": f"q{i}", "completion": "a", "label": i % 2 == 0} for i in range(4)]
    )
    (_,), _, found = preflight("dpo", unpaired)
    assert [(f.rule, f.severity, f.source) for f in found] == [("PF075", Severity.ERROR, f"{unpaired}:1")]
    sft = jsonl(tmp_path / "chat.jsonl", [{"messages": [user("q"), bot("a")]}])
    (_,), _, found = preflight("reward", sft)
    assert found[0].rule == "PF014" and "supervised fine-tuning data (messages)" in found[0].message


def test_pairs_for_kto_are_unpaired_and_said_and_bad_rows_are_named(tmp_path) -> None:
    rows = [{"prompt": f"q{i}", "chosen": " yes", "rejected": " no"} for i in range(5)]
    rows[3]["rejected"] = " yes"  # identical: skipped, named with its line
    pairs = jsonl(tmp_path / "pairs.jsonl", rows)
    (settled,), (counted,), found = preflight("kto", pairs)
    assert {(f.rule, f.severity) for f in found} == {("PF076", Severity.NOTE), ("PF017", Severity.WARNING)}
    skipped = next(f for f in found if f.rule == "PF017")
    assert f"{pairs}:4" in skipped.source and "nothing to prefer" in skipped.message
    assert settled.detected.kind == "preference" and counted.rows_checked == 8  # 4 pairs, two KTO rows each
    (settled,), (counted,), found = preflight("dpo", pairs)
    assert [f.rule for f in found] == ["PF017"] and counted.rows_checked == 4


def test_every_row_skipped_is_an_error_and_text_and_conversations_do_not_mix(tmp_path) -> None:
    same = jsonl(tmp_path / "same.jsonl", [{"prompt": "q", "chosen": " a", "rejected": " a"}] * 3)
    (_,), _, found = preflight("dpo", same)
    assert [(f.rule, f.severity) for f in found] == [("PF017", Severity.ERROR)]
    text = jsonl(tmp_path / "text.jsonl", [{"prompt": "q", "chosen": " a", "rejected": " b"}])
    chats = jsonl(tmp_path / "chats.jsonl", [{"chosen": [user("q"), bot("a")], "rejected": [user("q"), bot("b")]}])
    _, _, found = preflight("dpo", text, chats)
    assert [f.rule for f in found] == ["PF077"]
