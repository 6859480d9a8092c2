"""Pre-flight for the data: every kind of local source is found and its format detected before any rank starts;
unreadable files, folders that mix kinds of files (#17), columns that match no format, rows of another format
are refused; skipped and out-of-order rows are reported with file and row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.preflight.data import settle
from fsdp_tune.sources.mixture import Source
from tests.conftest import FIXTURES

BASE = str(FIXTURES / "tiny_lora.yaml")
ALPACA = [{"instruction": f"Add {i} and 1.", "input": "", "output": str(i + 1)} for i in range(6)]
SHAREGPT = [
    {"conversations": [{"from": "human", "value": f"Q{i}"}, {"from": "gpt", "value": f"A{i}"}]} for i in range(4)
]


def jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def table(rows: list):
    import pyarrow as pa

    return pa.Table.from_pylist(rows)


def write_arrow(path: Path, rows: list) -> Path:
    import pyarrow as pa

    path.parent.mkdir(parents=True, exist_ok=True)
    t = table(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, t.schema) as writer:
        writer.write_table(t)
    return path


def saved_to_disk(folder: Path, rows: list) -> Path:
    """The layout Dataset.save_to_disk writes (an Arrow stream plus its two JSON files)."""
    write_arrow(folder / "data-00000-of-00001.arrow", rows)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (folder / "dataset_info.json").write_text("{}")
    return folder


def one(source: Source, eval_wanted: bool = False, text_field: str = "text"):
    (settled,), _, findings = settle((source,), text_field, None, eval_wanted)
    return settled, findings


def _csv(path: Path, rows: list, sep: str = ",") -> Path:
    import csv

    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=sep)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _sources(tmp_path: Path) -> dict[str, tuple[Source, str, str]]:
    """source -> (Source, the loader found, the format detected)."""
    import pyarrow.parquet as pq

    pq.write_table(table(ALPACA), tmp_path / "alpaca.parquet")
    (tmp_path / "array.json").write_text(json.dumps(SHAREGPT))
    messages = [{"messages": json.dumps([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])}]
    jsonl(tmp_path / "shards" / "part-0.jsonl", ALPACA[:3])
    jsonl(tmp_path / "shards" / "part-1.jsonl", ALPACA[3:])
    jsonl(tmp_path / "splits" / "train.jsonl", SHAREGPT)
    jsonl(tmp_path / "splits" / "test.jsonl", SHAREGPT[:1])
    return {
        "jsonl": (Source(str(jsonl(tmp_path / "a.jsonl", ALPACA))), "json", "alpaca"),
        "json array": (Source(str(tmp_path / "array.json")), "json", "sharegpt"),
        "csv, JSON in cells": (Source(str(_csv(tmp_path / "m.csv", messages))), "csv", "messages"),
        "tsv": (Source(str(_csv(tmp_path / "a.tsv", ALPACA, "\t"))), "csv", "alpaca"),
        "parquet": (Source(str(tmp_path / "alpaca.parquet")), "parquet", "alpaca"),
        "arrow": (Source(str(write_arrow(tmp_path / "s.arrow", ALPACA))), "arrow", "alpaca"),
        "save_to_disk": (Source(str(saved_to_disk(tmp_path / "saved", ALPACA))), "disk", "alpaca"),
        "folder of shards": (Source(str(tmp_path / "shards")), "json", "alpaca"),
        "folder of splits": (Source(str(tmp_path / "splits"), eval_split="test"), "json", "sharegpt"),
        "data_files glob": (Source("json", data_files=str(tmp_path / "shards" / "*.jsonl")), "json", "alpaca"),
        "builtin": (Source("builtin:demo-chat"), "json", "messages"),
    }


@pytest.mark.parametrize(
    "name",
    [
        "jsonl",
        "json array",
        "csv, JSON in cells",
        "tsv",
        "parquet",
        "arrow",
        "save_to_disk",
        "folder of shards",
        "folder of splits",
        "data_files glob",
        "builtin",
    ],
)
def test_every_local_source_is_located_and_detected(tmp_path, name) -> None:
    source, loader, kind = _sources(tmp_path)[name]
    settled, findings = one(source, eval_wanted=True)
    assert [f for f in findings if f.severity.value == "error"] == [], findings
    assert settled.loader == loader and settled.detected.kind == kind
    assert settled.files["train"] and all(Path(f).exists() for f in settled.files["train"])
    if name == "folder of splits":
        assert settled.eval_split == "test" and len(settled.files) == 2
    if name == "folder of shards":
        assert len(settled.files["train"]) == 2


def _rules(findings) -> list[tuple[str, str]]:
    return [(f.rule, f.severity.value) for f in findings]


def test_mixed_and_unreadable_folders_are_refused_naming_the_file(tmp_path) -> None:
    """#17: these passed pre-flight and failed in the ranks."""
    jsonl(tmp_path / "mixed" / "a.jsonl", ALPACA)
    _csv(tmp_path / "mixed" / "b.csv", ALPACA)
    _, findings = one(Source(str(tmp_path / "mixed")))
    assert _rules(findings) == [("PF019", "error")] and "b.csv" in findings[0].message
    jsonl(tmp_path / "schemas" / "a.jsonl", ALPACA)
    jsonl(tmp_path / "schemas" / "b.jsonl", SHAREGPT)
    _, findings = one(Source(str(tmp_path / "schemas")))
    assert _rules(findings) == [("PF019", "error")] and findings[0].source.endswith("b.jsonl")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "x.parquet").write_bytes(b"not a parquet file at all")
    _, findings = one(Source(str(tmp_path / "garbage")))
    assert _rules(findings) == [("PF012", "error")] and findings[0].source.endswith("x.parquet")
    assert "cannot be read as parquet" in findings[0].message


def test_row_findings_name_file_and_line(tmp_path) -> None:
    rows = [*ALPACA, {"instruction": "Q", "output": ""}, SHAREGPT[0]]
    path = jsonl(tmp_path / "a.jsonl", rows)
    _, findings = one(Source(str(path)))
    by_rule = {f.rule: f for f in findings}
    assert by_rule["PF016"].severity.value == "error" and by_rule["PF016"].source == f"{path}:8"
    assert "sharegpt format in this alpaca dataset" in by_rule["PF016"].message
    assert by_rule["PF017"].severity.value == "warning" and by_rule["PF017"].source == f"{path}:7"
    assert "skipped: an empty answer" in by_rule["PF017"].message
    order = jsonl(
        tmp_path / "o.jsonl",
        [
            {
                "conversations": [
                    {"from": "gpt", "value": "hi"},
                    {"from": "human", "value": "x"},
                    {"from": "gpt", "value": "y"},
                ]
            }
        ],
    )
    _, findings = one(Source(str(order)))
    assert _rules(findings) == [("PF018", "warning")] and "starts with the assistant" in findings[0].message
    empty = jsonl(tmp_path / "e.jsonl", [{"instruction": "Q", "output": ""}])
    _, findings = one(Source(str(empty)))
    assert _rules(findings) == [("PF017", "error")] and "every row is skipped" in findings[0].message


def test_slices_limit_the_rows_checked(tmp_path) -> None:
    path = jsonl(tmp_path / "a.jsonl", [*ALPACA, {"instruction": "Q", "output": ""}])
    assert one(Source(str(path), split="train[:6]"))[1] == []
    assert _rules(one(Source(str(path), split="train[-1:]"))[1]) == [("PF017", "error")]


def test_eval_without_a_held_out_split(tmp_path) -> None:
    path = jsonl(tmp_path / "a.jsonl", ALPACA)
    settled, findings = one(Source(str(path), eval_split="test"), eval_wanted=True)
    assert _rules(findings) == [("PF013", "error")] and settled.eval_split is None
    settled, findings = one(Source(str(path), eval_split="test"), eval_wanted=False)  # not asked for: not read
    assert findings == [] and settled.eval_split is None


def test_hub_datasets_offline(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    settled, findings = one(Source("acme/ChatLogs"))
    assert _rules(findings) == [("PF015", "error")] and settled.detected is None
    (tmp_path / "datasets" / "acme___chat_logs" / "default").mkdir(parents=True)  # datasets' own cache layout
    settled, findings = one(Source("acme/ChatLogs"))
    assert findings == [] and settled.loader is None and settled.detected is None  # rank 0 detects


runner = CliRunner()


def _plan(tmp_path, *flags: str) -> str:
    """The plan `train` prints (--dry_run adds the memory planner, which imports torch: not here)."""
    from fsdp_tune.launch.torchrun import command
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.output.run import describe_launch

    planned = plan_run(BASE, ["--output_dir", str(tmp_path / "o"), *flags], print)
    assert not [f for f in planned.machine_findings if f.severity.value == "error"], planned.machine_findings
    return describe_launch(planned.config, planned.spec, command(planned.spec), planned.counted)


def test_the_plan_shows_each_dataset_and_the_spec_carries_its_format(tmp_path) -> None:
    path = jsonl(tmp_path / "a.jsonl", ALPACA)
    assert f"dataset: {path} [train]: alpaca; loss on the answers" in _plan(tmp_path, "--dataset_name", str(path))
    args = ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dataset_name", str(path), "--dry_run"]
    r = runner.invoke(app, [*args, "--json", "--train_on_prompt"])
    (source,) = json.loads(r.output)["spec"]["data"]["sources"]
    assert source["detected"]["kind"] == "alpaca" and source["loader"] == "json" and source["train_on_prompt"]
    # PEFT's examples path (the seed scripts): a template and --dataset_text_field naming the rendered text
    text = _plan(tmp_path, "--dataset_name", str(path), "--dataset_text_field", "content")
    assert "loss on the answers" in text  # alpaca rows: the rendered-text path is for `messages` data
    text = _plan(tmp_path, "--dataset_text_field", "content")  # the builtin chats
    assert "loss on every token" in text and "PEFT's examples path" in text


def test_no_format_is_refused_before_launch(tmp_path) -> None:
    path = jsonl(tmp_path / "a.jsonl", [{"question": "q", "answer": "a"}])
    r = runner.invoke(
        app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dataset_name", str(path)]
    )
    assert r.exit_code == 2 and "PF014" in r.output and "answer, question match no format" in r.output
    assert not (tmp_path / "o").exists()
    text = _plan(tmp_path, "--dataset_name", str(path), "--dataset_columns", "prompt=question,completion=answer")
    assert "prompt_completion [prompt=question, completion=answer]" in text


def test_the_columns_example_is_built_from_the_users_columns(tmp_path) -> None:
    """#48: odd columns get a --dataset_columns example of their own names (text columns in the data's order; an
    id column of numbers left out), and that example, run as printed, trains."""
    path = jsonl(tmp_path / "odd.jsonl", [{"id": i, "query": f"what is {i}", "reply": f"it is {i}"} for i in range(4)])
    args = ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dataset_name", str(path)]
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "PF014" in r.output
    assert "hint: map your columns, e.g. --dataset_columns prompt=query,completion=reply" in r.output
    text = _plan(tmp_path, "--dataset_name", str(path), "--dataset_columns", "prompt=query,completion=reply")
    assert "prompt_completion [prompt=query, completion=reply]" in text
    turns = jsonl(
        tmp_path / "t.jsonl", [{"dialog": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    )
    r = runner.invoke(app, [*args[:-1], str(turns)])
    assert "--dataset_columns messages=dialog" in r.output
    pairs = jsonl(tmp_path / "p.jsonl", [{"question": "q", "good": "a", "bad": "b"}])
    r = runner.invoke(app, [*args[:-1], str(pairs), "--method", "dpo"])
    assert "--dataset_columns prompt=question,chosen=good,rejected=bad" in r.output, r.output


def test_a_refusal_is_said_once_for_one_file_in_two_entries(tmp_path) -> None:
    """PF014 for a file two `datasets:` entries read (train[:50%], train[50%:]) is one problem, said once."""
    from fsdp_tune.launch.train import plan_run

    path = jsonl(tmp_path / "odd.jsonl", [{"query": "q", "reply": "r", "id": 1}] * 4)
    mixture = json.dumps([{"path": str(path), "split": "train[:50%]"}, {"path": str(path), "split": "train[50%:]"}])
    planned = plan_run(BASE, ["--output_dir", str(tmp_path / "o"), "--datasets", mixture], print)
    assert [f.rule for f in planned.machine_findings if f.rule.startswith("PF01")] == ["PF014"]


def test_the_preflight_never_writes_the_spec(tmp_path, monkeypatch) -> None:
    """The spec `decide()` returns is the spec the ranks get, field for field: the data's format (and files,
    train_on_prompt) is decided there from the files read once, and what the pre-flight counts (rows, tokens,
    images) stands beside it (#47). Neither replaced nor changed in place by any step after decide()."""
    import copy

    import fsdp_tune.launch.train as train_step

    decided = []

    def recording(*args, **kwargs):
        spec = real(*args, **kwargs)
        decided.append((spec, copy.deepcopy(spec.as_dict())))
        return spec

    real = train_step.decide
    monkeypatch.setattr(train_step, "decide", recording)
    path = jsonl(tmp_path / "a.jsonl", ALPACA)
    planned = train_step.plan_run(BASE, ["--output_dir", str(tmp_path / "o"), "--dataset_name", str(path)], print)
    [(spec, as_decided)] = decided  # decided once
    assert planned.spec is spec and planned.spec.as_dict() == as_decided
    (source,) = spec.data.sources
    assert source.detected.kind == "alpaca" and source.files == {"train": [str(path)]}
    (counted,) = planned.counted
    assert counted.rows_checked == len(ALPACA) and counted.tokenized is not None
