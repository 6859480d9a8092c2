"""Odd data files get a clear answer before launch (#26 item 9) and the data path says what it does (#25 item 9):
every JSON line is parsed (a broken line after the rows kept for the checks is found, the time it may take is
bounded and said), a key given twice in a row is refused with its line, a UTF-8 BOM is read past as `datasets`
does, a CSV row with more cells than the header is refused; the plan says the weight an entry without one
gets, and packing; the summary counts the packed rows and the rows cut before tokenizing. Rows far longer than
max_seq_len are cut to its reach before rendering (#26 item 10): clip.py, with a stand-in tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fsdp_tune.launch.torchrun import command
from fsdp_tune.launch.train import plan_run
from fsdp_tune.output.data import summary_lines
from fsdp_tune.output.run import describe_launch
from fsdp_tune.preflight.data import settle
from fsdp_tune.sources import sample
from fsdp_tune.sources.clip import Reach, TooLarge, clip, row_chars
from fsdp_tune.sources.encode import Encoder
from fsdp_tune.sources.mixture import Source
from tests.conftest import FIXTURES

BASE = FIXTURES / "tiny_lora.yaml"
PC = '{"prompt": "What is 2 plus 2?", "completion": " 4"}'


def one(path: Path) -> tuple[Source, list]:
    (settled,), _, findings = settle((Source(str(path)),), "text", None, False)
    return settled, findings


def rules(findings) -> list[tuple[str, str, str]]:
    return [(f.rule, f.severity.value, f.source) for f in findings]


def test_every_json_line_is_parsed_past_the_rows_kept(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sample, "MAX_ROWS", 50)  # 100,000 in a run: a broken line after it went to rank 0
    data = tmp_path / "a.jsonl"
    data.write_text("\n".join([PC] * 119 + ['{"prompt": "x", "completion": '] + [PC] * 5) + "\n")
    _, findings = one(data)
    assert rules(findings) == [("PF012", "error", f"{data}:120")] and "malformed JSON line" in findings[0].message


def test_parsing_past_the_rows_kept_is_bounded_in_time_and_said(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(sample, "MAX_ROWS", 10)
    monkeypatch.setattr(sample, "SCAN_SECONDS", -1.0)  # out of time at once: parsing stops at the first look
    data = tmp_path / "a.jsonl"
    data.write_text("\n".join([PC] * 9000) + "\n")
    settled, findings = one(data)
    assert rules(findings) == [("PF072", "note", f"{data}:4096")]
    assert "parsed up to line 4,096" in findings[0].message and settled.detected.kind == "prompt_completion"


def test_a_key_given_twice_is_refused_with_its_line(tmp_path) -> None:
    lines = tmp_path / "a.jsonl"
    lines.write_text("\n".join([PC] * 4 + ['{"prompt": "a", "prompt": "b", "completion": " c"}']) + "\n")
    assert rules(one(lines)[1]) == [("PF012", "error", f"{lines}:5")]
    assert "'prompt' is given twice" in one(lines)[1][0].message
    nested = tmp_path / "b.jsonl"
    turn = '{"role": "user", "content": "q", "content": "r"}'
    nested.write_text(f'{{"messages": [{turn}, {{"role": "assistant", "content": "a"}}]}}\n')
    assert rules(one(nested)[1]) == [("PF012", "error", f"{nested}:1")]
    array = tmp_path / "c.json"
    array.write_text('[{"prompt": "a", "completion": " b"}, {"prompt": "a", "completion": " b", "completion": ""}]')
    assert rules(one(array)[1]) == [("PF012", "error", str(array))]


@pytest.mark.parametrize("name,text", [("a.jsonl", PC + "\n" + PC + "\n"), ("a.json", f"[{PC}, {PC}]"), ("a.csv", "")])
def test_a_utf8_bom_is_read_past(tmp_path, name, text) -> None:
    data = tmp_path / name
    text = text or "prompt,completion\nWhat is 1 plus 1?,2\nWhat is 2 plus 2?,4\n"
    data.write_bytes(b"\xef\xbb\xbf" + text.encode())
    (settled,), (counted,), findings = settle((Source(str(data)),), "text", None, False)
    assert findings == [] and settled.detected.kind == "prompt_completion" and counted.rows_checked == 2


def test_a_csv_row_with_more_cells_than_the_header_is_refused(tmp_path) -> None:
    data = tmp_path / "a.csv"
    data.write_text("prompt,completion\nWhat is 1 plus 1?,2\nWhat is 1, plus 2?,3\n")
    assert rules(one(data)[1]) == [("PF012", "error", f"{data}:3")]


def test_the_plan_says_unset_weights_and_packing(tmp_path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text((PC + "\n") * 6)
    b.write_text((PC + "\n") * 3)
    config = yaml.safe_load(BASE.read_text())
    config["data"].pop("dataset_name")
    config["datasets"] = [{"path": str(a)}, {"path": str(b), "weight": 2}]
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(yaml.safe_dump(config))
    planned = plan_run(str(recipe), ["--output_dir", str(tmp_path / "o"), "--packing", "True"], print)
    out = describe_launch(planned.config, planned.spec, command(planned.spec), planned.counted)  # what train prints
    assert f"dataset: {a} [train]: prompt_completion; loss on the answers, weight 1 (unset)" in out, out
    assert f"dataset: {b} [train]: prompt_completion; loss on the answers, weight 2" in out
    assert "  packing: bfd, best-fit decreasing: whole sequences share rows of up to 96 tokens" in out


def test_the_summary_counts_packed_rows_and_rows_cut_before_tokenizing() -> None:
    source = {"source": "a.jsonl [train]", "kind": "messages", "rows": 50, "sequences": 50, "used": 50}
    source |= {"loss": "answers", "skipped": {}, "clipped": {"count": 1, "rows": ["a.jsonl row 7"]}}
    report = {"sources": [source], "tokens": 900, "loss_tokens": 300, "loss_share": 0.333}
    report["packed"] = {"strategy": "bfd", "sequences": 50, "rows": 7, "max_seq_len": 96}
    lines = summary_lines(report)
    assert "  data: packed (bfd): 50 sequences -> 7 rows of up to 96 tokens" in lines
    assert any(line.startswith("    cut before tokenizing, 1 row(s)") and "a.jsonl row 7" in line for line in lines)


# ---------------------------------------------------------------- clip.py


class Vocab:
    """A tokenizer as clip.py sees it: its longest entry is 4 characters."""

    def get_vocab(self) -> dict[str, int]:
        return {"a": 0, "abcd": 1}


REACH = Reach.of(Vocab(), 10)  # (10 + 64) tokens x 4 characters; bound 64 x 10 x 4


def test_the_reach_is_max_seq_len_in_the_longest_tokens() -> None:
    assert (REACH.chars, REACH.bound) == (296, 2560)


def test_turns_past_the_reach_are_left_out_and_the_crossing_one_cut_at_a_word() -> None:
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 8} for i in range(10_000)]
    cut = clip({"messages": turns}, REACH.chars)
    assert len(cut["messages"]) == 8 and cut["messages"][:7] == turns[:7]  # 7 x 40 characters, then 16 more
    assert cut["messages"][7]["content"] == "word word word w" + "ord"  # to the end of the word
    assert row_chars(cut) < REACH.chars + 8


def test_strings_are_cut_from_the_end_they_lose() -> None:
    words = " ".join(f"w{i:03d}" for i in range(200))  # 999 characters
    assert clip({"text": words}, 296)["text"] == words[:299]
    assert clip({"text": words}, 296, keep_end=True)["text"] == words[-299:]
    row = clip({"prompt": words, "completion": " yes"}, 296)
    assert row["prompt"] == words[:299] and row["completion"] == ""
    row = clip({"prompt": words, "completion": " yes"}, 296, keep_end=True)
    assert row["completion"] == " yes" and row["prompt"] == words[-294:]
    chat = {"prompt": [{"role": "user", "content": words}], "completion": [{"role": "assistant", "content": "a"}]}
    assert clip(chat, 296, keep_end=True) is None  # a conversation under keep_end: bounded, not cut


def test_what_cannot_be_cut_is_bounded() -> None:
    whole = Encoder(Vocab(), max_len=None, seq_len=10)  # packing that keeps every token
    assert whole.fit({"text": "x" * 2000}) == ({"text": "x" * 2000}, False)
    with pytest.raises(TooLarge, match="2,561 characters, over the per-row bound of 2,560"):
        whole.fit({"text": "x" * 2561})
    cut = Encoder(Vocab(), max_len=10)
    assert cut.fit({"text": "x" * 10**6}) == ({"text": "x" * 296}, True)
