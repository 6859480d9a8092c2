"""Format detection from columns and values, conversion to TRL's representation, row checks, mixture counts.
Pure Python: the launcher runs all of this before any rank starts."""

from __future__ import annotations

import json

import pytest

from fsdp_tune.sources import formats as F
from fsdp_tune.sources.convert import to_trl, tool_calls_as_text
from fsdp_tune.sources.mixture import Source, entry_problems, from_entry, mixture_problems, plan_counts, slice_rows
from fsdp_tune.sources.rowcheck import check_row


def detect(rows, **kw):
    return F.detect_format(set().union(*(r.keys() for r in rows)), rows, **kw)


def codes(row, fmt, roles=None):
    return sorted(p.code for p in check_row(row, fmt, roles))


MESSAGES = [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}]
ALPACA = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Say hi.", "input": "", "output": "Hi!"},
    {"instruction": "Next?", "input": "", "output": "Sure.", "system": "Be brief.", "history": [["Hello", "Hi there"]]},
]
SHAREGPT = [
    {
        "conversations": [
            {"from": "system", "value": "S"},
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Yo"},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "Q1"},
            {"from": "chatgpt", "value": "A1"},
            {"from": "user", "value": "Q2"},
            {"from": "bing", "value": "A2"},
        ]
    },
    {
        "conversations": [
            {"from": "human", "value": "2*3?"},
            {"from": "function_call", "value": '{"name": "mul", "arguments": {"a": 2, "b": 3}}'},
            {"from": "observation", "value": "6"},
            {"from": "gpt", "value": "It is 6."},
        ],
        "tools": '[{"type": "function", "function": {"name": "mul", "parameters": {}}}]',
    },
]
PLAIN_PC = [{"prompt": "The sky is", "completion": " blue."}]
CONV_PC = [{"prompt": [{"role": "user", "content": "Sky?"}], "completion": [{"role": "assistant", "content": "Blue."}]}]


@pytest.mark.parametrize(
    "rows,kind,conversational",
    [
        (MESSAGES, F.MESSAGES, False),
        (ALPACA, F.ALPACA, False),
        (SHAREGPT, F.SHAREGPT, False),
        (PLAIN_PC, F.PROMPT_COMPLETION, False),
        (CONV_PC, F.PROMPT_COMPLETION, True),
        ([{"text": "hello"}], F.TEXT, False),
    ],
)
def test_every_format_is_detected_from_its_columns(rows, kind, conversational) -> None:
    fmt = detect(rows)
    assert (fmt.kind, fmt.conversational) == (kind, conversational)
    assert all(codes(r, fmt) == [] for r in rows), [check_row(r, fmt) for r in rows]
    assert F.Format.from_dict(json.loads(json.dumps(fmt.as_dict()))) == fmt  # travels in the rank spec


def test_alpaca_becomes_messages_the_llama_factory_way() -> None:
    fmt = detect(ALPACA)
    assert to_trl(ALPACA[0], fmt)["messages"] == [
        {"role": "user", "content": "Add the numbers.\n2 and 3"},
        {"role": "assistant", "content": "5"},
    ]
    assert to_trl(ALPACA[1], fmt)["messages"][0] == {"role": "user", "content": "Say hi."}  # no trailing newline
    roles = [m["role"] for m in to_trl(ALPACA[2], fmt)["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]  # history answers are trained too
    dolly = detect([{"instruction": "Q", "context": "C", "response": "A", "category": "qa"}])
    assert dolly.kind == F.ALPACA and dolly.columns["input"] == "context" and dolly.columns["output"] == "response"


def test_sharegpt_speakers_tools_and_system() -> None:
    fmt = detect(SHAREGPT)
    assert (fmt.role_key, fmt.content_key) == ("from", "value")
    assert [m["role"] for m in to_trl(SHAREGPT[0], fmt)["messages"]] == ["system", "user", "assistant"]
    assert [m["role"] for m in to_trl(SHAREGPT[1], fmt)["messages"]] == ["user", "assistant"] * 2
    tool = to_trl(SHAREGPT[2], fmt)
    assert tool["messages"][1]["tool_calls"][0]["function"] == {"name": "mul", "arguments": {"a": 2, "b": 3}}
    assert tool["messages"][2] == {"role": "tool", "content": "6"} and tool["tools"][0]["function"]["name"] == "mul"
    as_text = tool_calls_as_text(tool["messages"])
    assert as_text[1]["content"].startswith('{"name": "mul"')
    row = {"conversations": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}], "system": "S"}
    fmt = detect([row])
    assert fmt.kind == F.SHAREGPT and to_trl(row, fmt)["messages"][0] == {"role": "system", "content": "S"}
    styled = [{"messages": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]}]
    fmt = detect(styled)
    assert fmt.kind == F.SHAREGPT and fmt.columns["conversations"] == "messages" and fmt.notes


def test_roles_map_extends_the_speakers() -> None:
    fmt = detect(SHAREGPT)
    row = {"conversations": [{"from": "human", "value": "Q"}, {"from": "narrator", "value": "A"}]}
    assert "unknown-role" in codes(row, fmt)
    assert codes(row, fmt, roles={"narrator": "assistant"}) == []


def test_overrides_and_mappings() -> None:
    rows = [{"messages": MESSAGES[0]["messages"], "text": "rendered"}]
    fmt = detect(rows)
    assert fmt.kind == F.MESSAGES and any("also matches text" in n for n in fmt.notes)
    assert detect(rows, forced="text").kind == F.TEXT
    qa = [{"question": "2+2?", "answer": "4"}]
    fmt = detect(qa, column_map={"prompt": "question", "completion": "answer"})
    assert fmt.kind == F.PROMPT_COMPLETION and to_trl(qa[0], fmt) == {"prompt": "2+2?", "completion": "4"}
    fmt = detect(qa, forced="alpaca", column_map={"instruction": "question", "output": "answer"})
    assert to_trl(qa[0], fmt)["messages"][-1] == {"role": "assistant", "content": "4"}
    assert detect([{"content": "hi"}], text_field="content").columns == {"text": "content"}


def test_json_text_in_csv_cells_and_arrow_nulls() -> None:
    rows = [{"messages": json.dumps(MESSAGES[0]["messages"])}]
    fmt = detect(rows)
    assert fmt.kind == F.MESSAGES and any("JSON text" in n for n in fmt.notes)
    assert to_trl(rows[0], fmt)["messages"][1]["content"] == "4"
    nulls = {"messages": [{"role": "user", "content": "a", "tool_calls": None}, {"role": "assistant", "content": "b"}]}
    assert to_trl(nulls, detect([nulls]))["messages"][0] == {"role": "user", "content": "a"}


def test_no_format_names_the_columns_the_formats_and_a_fix() -> None:
    with pytest.raises(F.FormatError) as e:
        detect([{"instrution": "x", "outptu": "y", "id": 1}])
    assert "id, instrution, outptu" in str(e.value)
    assert all(kind in str(e.value) for kind in F.KINDS)
    assert e.value.hint == "--dataset_columns instruction=instrution,output=outptu (or rename the columns)"
    with pytest.raises(F.FormatError, match="would also need completion"):
        detect([{"prompt": "x"}])
    with pytest.raises(F.FormatError, match="needs column"):
        detect([{"question": "q"}], forced="alpaca")
    with pytest.raises(F.FormatError, match="prompt=question"):
        detect([{"q": "x"}], column_map={"prompt": "question"})
    with pytest.raises(F.FormatError, match="both be strings or both be lists"):
        detect([{"prompt": "x", "completion": [{"role": "assistant", "content": "y"}]}])


def test_rows_that_are_skipped_or_out_of_order() -> None:
    fmt = detect(SHAREGPT)
    bad = {
        "conversations": [
            {"from": "gpt", "value": "I start"},
            {"from": "human", "value": "Q"},
            {"from": "human", "value": "Q again"},
            {"from": "gpt", "value": ""},
        ]
    }
    assert codes(bad, fmt) == ["assistant-first", "consecutive-user", "empty-answer"]
    assert codes({"conversations": [{"from": "human", "value": "Q"}]}, fmt) == ["no-answer"]
    trailing = {
        "conversations": [
            {"from": "human", "value": "Q"},
            {"from": "gpt", "value": "A"},
            {"from": "human", "value": "Q2"},
        ]
    }
    assert codes(trailing, fmt) == ["trailing-turns"]
    alpaca = detect(ALPACA)
    assert codes({"instruction": "Q", "input": "", "output": "  "}, alpaca) == ["empty-answer"]
    assert codes({"instruction": "Q", "output": None}, alpaca) == ["missing"]
    assert "bad-history" in codes({"instruction": "Q", "output": "A", "history": "oops"}, alpaca)
    assert codes({"prompt": "p", "completion": ""}, detect(PLAIN_PC)) == ["empty-answer"]
    orphan = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "tool", "content": "6"},
            {"role": "assistant", "content": "a"},
        ]
    }
    assert codes(orphan, detect([orphan])) == ["orphan-tool"]
    assert codes({"text": " "}, detect([{"text": "x"}])) == ["empty-text"]


def test_mixture_entries_and_counts() -> None:
    assert plan_counts([100, 20], [Source("a", fraction=0.5), Source("b", fraction=0.5)]) == [20, 20]  # TRL's rule
    assert plan_counts([100, 20], [Source("a", samples=10), Source("b", samples=50)]) == [10, 50]  # b repeats
    assert plan_counts([100, 20], [Source("a", weight=3), Source("b", weight=1)]) == [90, 30]
    assert plan_counts([100, 20], [Source("a"), Source("b", samples=5)]) == [100, 5]
    # #25: an entry without a weight weighs 1 once any entry has one, so `weight: 2` doubles that source
    assert plan_counts([100, 20], [Source("a"), Source("b", weight=2)]) == [40, 80]
    assert plan_counts([60, 20, 9], [Source("a"), Source("b", weight=2), Source("c", samples=3)]) == [27, 53, 3]
    source = from_entry(
        {"path": "x.jsonl", "split": "train[:5%]", "columns": {"prompt": "q"}, "format": "alpaca"}, False
    )
    assert (source.split, source.column_map, source.columns, source.format) == (
        "train[:5%]",
        {"prompt": "q"},
        None,
        "alpaca",
    )
    assert from_entry({"path": "x", "columns": ["a", "b"]}, True).columns == ("a", "b")
    assert entry_problems({"path": "x", "weight": 1, "samples": 3}) == [
        "give one of fraction, weight, samples, not weight and samples"
    ]
    assert "unknown key(s) wieght" in entry_problems({"path": "x", "wieght": 2})[0]
    assert mixture_problems([{"path": "a", "fraction": 0.5}, {"path": "b"}])[-1].startswith("`fraction` must be set")


@pytest.mark.parametrize(
    "spec,n,rows",
    [
        ("train", 40, range(0, 40)),
        ("train[:5%]", 40, range(0, 2)),
        ("train[10:20]", 40, range(10, 20)),
        ("train[-10%:]", 40, range(36, 40)),
    ],
)
def test_split_slices(spec, n, rows) -> None:
    assert slice_rows(spec, n) == rows
