"""Rank 0's data preparation without torchrun: every format and every source turned into `input_ids` and
answer masks, the masks checked token by token against chat templates with and without {% generation %}
markers, mixtures, held-out splits, skipped rows, and the prepared result read back instead of redone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_tune.sources.masking import InconsistentTemplate, encode_messages
from tests.conftest import FIXTURES
from tests.datafiles import hub_cache, jsonl

BASE = str(FIXTURES / "tiny_lora.yaml")
MULTI = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 plus 2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3 plus 3?"},
    {"role": "assistant", "content": "6."},
]


@pytest.fixture(scope="module")
def tok():
    from fsdp_tune.models.tiny import build_tokenizer

    return build_tokenizer(512)  # the builtin model's ChatML tokenizer


def spans(tok, ids, mask) -> list[str]:
    """The decoded runs of tokens in the loss."""
    out, run = [], []
    for t, m in zip([*ids, None], [*mask, 0], strict=True):
        if m:
            run.append(t)
        elif run:
            out.append(tok.decode(run))
            run = []
    return out


# ---------------------------------------------------------------- masks


def test_chatml_trains_every_answer_and_matches_generation_markers(tok) -> None:
    import copy

    from fsdp_tune.config.templates import CHATML_ANSWERS_MARKED

    (enc,) = encode_messages(tok, MULTI)
    assert spans(tok, enc.input_ids, enc.mask) == ["4.<|im_end|>", "6.<|im_end|>"]
    marked = copy.deepcopy(tok)
    marked.chat_template = CHATML_ANSWERS_MARKED
    rows = [
        json.loads(line)["messages"]
        for line in (FIXTURES.parent.parent / "fsdp_tune/assets/demo_chat/train.jsonl").read_text().splitlines()[:40]
    ]
    for messages in [MULTI, *rows]:
        (enc,) = encode_messages(tok, messages)
        out = marked.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        assert (enc.input_ids, enc.mask) == (list(out["input_ids"]), list(out["assistant_masks"]))  # TRL's own mask
    (enc,) = encode_messages(tok, MULTI, train_all=True)
    assert all(enc.mask)


def test_zephyr_answers_and_dropped_tool_turns(tok) -> None:
    import copy

    from fsdp_tune.config.templates import ZEPHYR

    z = copy.deepcopy(tok)
    z.add_special_tokens({"bos_token": ZEPHYR["bos_token"], "eos_token": ZEPHYR["eos_token"]})
    z.chat_template = ZEPHYR["template"]
    (enc,) = encode_messages(z, MULTI)
    # the generation prompt is '<|assistant|>' and the turn renders '<|assistant|>\n': the model must write the \n
    assert spans(z, enc.input_ids, enc.mask) == ["\n4.</s>", "\n6.</s>"]
    tool = [*MULTI[:2], {"role": "tool", "content": "RESULT=4"}, MULTI[2]]
    (enc,) = encode_messages(z, tool)
    assert any("(tool)" in p for p in enc.problems)  # zephyr drops tool turns: said, not silent


def test_templates_that_rerender_earlier_turns(tok) -> None:
    """Qwen3 strips the reasoning of turns before the last user turn: the prefix rule does not hold there."""
    import copy

    import trl

    q = copy.deepcopy(tok)
    q.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    q.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen3.jinja").read_text()
    chat = [
        {"role": "user", "content": "What is 2 plus 2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."},
        {"role": "user", "content": "And 3 plus 3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6."},
    ]
    split = encode_messages(q, chat, fallback="split")
    assert len(split) == 2 and split[1].methods == ["split"]
    assert "4." in spans(q, split[1].input_ids, split[1].mask)[0]  # the earlier turn, rendered as at inference
    assert any("6." in s for s in spans(q, split[0].input_ids, split[0].mask))
    (located,) = encode_messages(q, chat, fallback="locate")
    assert located.methods == ["locate", "prefix"] and len(spans(q, located.input_ids, located.mask)) == 2
    with pytest.raises(InconsistentTemplate):
        encode_messages(q, chat, fallback="error")


# ---------------------------------------------------------------- preparation


def prepared(tmp_path: Path, tok, *flags: str, config: str = BASE):
    """plan_run (the launcher: pre-flight and the spec) then rank 0's preparation."""
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.worker.data.prepare import prepare

    planned = plan_run(config, ["--output_dir", str(tmp_path / "run"), *flags], print)
    errors = [f for f in planned.machine_findings if f.severity.value == "error"]
    assert not errors, errors
    return prepare(planned.spec, tok)


def answers(tok, dataset) -> list[list[str]]:
    return [spans(tok, r["input_ids"], r["assistant_masks"]) for r in dataset]


FORMATS = {
    "messages": ({"messages": MULTI}, ["4.<|im_end|>", "6.<|im_end|>"]),
    "sharegpt": (
        {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}], "system": "S"},
        ["Hello<|im_end|>"],
    ),
    "alpaca": (
        {"instruction": "Add.", "input": "2 and 3", "output": "5", "history": [["Hi", "Yo"]]},
        ["Yo<|im_end|>", "5<|im_end|>"],
    ),
    "prompt_completion": ({"prompt": "The sky is", "completion": " blue."}, [" blue.<|im_end|>"]),
    "conversational prompt_completion": (
        {"prompt": [{"role": "user", "content": "Sky?"}], "completion": [{"role": "assistant", "content": "Blue."}]},
        ["Blue.<|im_end|>\n"],  # TRL's prompt-completion rule: everything after the prompt
    ),
    "text": ({"text": "plain words"}, ["plain words<|im_end|>"]),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_format_is_prepared_with_its_answers_in_the_loss(tmp_path, tok, name) -> None:
    row, expected = FORMATS[name]
    data = jsonl(tmp_path / "d.jsonl", [row] * 3)
    p = prepared(tmp_path, tok, "--dataset_name", str(data))
    assert p.train.column_names == ["input_ids", "assistant_masks"] and len(p.train) == 3
    assert answers(tok, p.train)[0] == expected
    everything = prepared(tmp_path / "all", tok, "--dataset_name", str(data), "--train_on_prompt")
    assert all(all(r["assistant_masks"]) for r in everything.train)
    assert everything.report["loss_share"] == 1.0 and (p.report["loss_share"] < 1.0) == (name != "text")


ALPACA = [{"instruction": f"Add {i} and 1.", "input": "", "output": f"It is {i + 1}."} for i in range(20)]


def _source(tmp_path: Path, kind: str) -> list[str]:
    """Flags naming the same 20 alpaca rows stored as `kind` (split 'train', 'test' with 5 rows where it has one)."""
    import datasets

    ds = datasets.Dataset.from_list(ALPACA)
    root = tmp_path / "src"
    root.mkdir()
    if kind == "jsonl":
        return ["--dataset_name", str(jsonl(root / "a.jsonl", ALPACA))]
    if kind == "json array":
        (root / "a.json").write_text(json.dumps(ALPACA))
        return ["--dataset_name", str(root / "a.json")]
    if kind in ("csv", "tsv"):
        ds.to_csv(str(root / f"a.{kind}"), sep="\t" if kind == "tsv" else ",", index=False)
        return ["--dataset_name", str(root / f"a.{kind}")]
    if kind == "parquet":
        ds.to_parquet(str(root / "a.parquet"))
        return ["--dataset_name", str(root / "a.parquet")]
    if kind == "arrow":
        ds.save_to_disk(str(root / "saved"))
        arrow = next((root / "saved").glob("*.arrow"))
        return ["--dataset_name", str(arrow.rename(root / "a.arrow"))]
    if kind == "save_to_disk":
        datasets.DatasetDict({"train": ds, "test": ds.select(range(5))}).save_to_disk(str(root / "dd"))
        return ["--dataset_name", str(root / "dd"), "--dataset_test_split", "test", "--eval_strategy", "steps"]
    if kind == "folder of files":
        jsonl(root / "f" / "train-00000-of-00002.jsonl", ALPACA[:10])
        jsonl(root / "f" / "train-00001-of-00002.jsonl", ALPACA[10:])
        jsonl(root / "f" / "test.jsonl", ALPACA[:5])
        return ["--dataset_name", str(root / "f"), "--splits", "train,test", "--eval_strategy", "steps"]
    if kind == "data_files":
        jsonl(root / "d" / "x.jsonl", ALPACA)
        return ["--dataset_name", str(root / "d"), "--data_files", "x.jsonl"]
    raise AssertionError(kind)


SOURCES = ["jsonl", "json array", "csv", "tsv", "parquet", "arrow", "save_to_disk", "folder of files", "data_files"]


@pytest.mark.parametrize("kind", SOURCES)
def test_every_local_source_is_prepared(tmp_path, tok, kind) -> None:
    p = prepared(tmp_path, tok, *_source(tmp_path, kind))
    assert len(p.train) == 20 and answers(tok, p.train)[3] == ["It is 4.<|im_end|>"]
    assert p.report["sources"][0]["kind"] == "alpaca"
    if kind in ("save_to_disk", "folder of files"):
        assert p.eval is not None and len(p.eval) == 5 and p.report["eval"]["loss_tokens"] > 0


def test_hub_dataset_from_the_offline_cache_with_config_and_slice(tmp_path, tok, monkeypatch) -> None:
    import datasets

    hub_cache(tmp_path / "cache", "acme/chat", "sub", {"train": jsonl(tmp_path / "t.jsonl", ALPACA)})
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    flags = ["--dataset_name", "acme/chat", "--dataset_config", "sub", "--dataset_train_split", "train[:25%]"]
    p = prepared(tmp_path, tok, *flags)
    assert len(p.train) == 5 and answers(tok, p.train)[0] == ["It is 1.<|im_end|>"]
    assert p.report["sources"][0]["format"] == "alpaca"  # detected on rank 0: the launcher cannot read the Hub


def mixture_config(tmp_path: Path, datasets_entries: list, **data) -> str:
    import yaml

    config = yaml.safe_load(Path(BASE).read_text())
    config["data"] = {k: v for k, v in config["data"].items() if k != "dataset_name"} | data
    config["datasets"] = datasets_entries
    out = tmp_path / "mixture.yaml"
    out.write_text(yaml.safe_dump(config))
    return str(out)


def test_mixture_with_fraction_weights_samples_and_held_out_rows(tmp_path, tok) -> None:
    a = jsonl(tmp_path / "a.jsonl", ALPACA)
    b = jsonl(tmp_path / "b.jsonl", [{"question": f"Q{i}", "answer": f"A{i}"} for i in range(8)])
    qa = {"prompt": "question", "completion": "answer"}
    entries = [{"path": str(a), "samples": 30}, {"path": str(b), "samples": 4, "columns": qa}]
    p = prepared(tmp_path, tok, config=mixture_config(tmp_path, entries))
    assert [s["used"] for s in p.report["sources"]] == [30, 4] and len(p.train) == 34  # a repeats, b is cut
    assert [s["kind"] for s in p.report["sources"]] == ["alpaca", "prompt_completion"]
    weighted = [{"path": str(a), "weight": 1}, {"path": str(b), "weight": 3, "columns": qa}]
    p = prepared(tmp_path / "w", tok, config=mixture_config(tmp_path, weighted, test_split_size=0.25))
    assert [s["used"] for s in p.report["sources"]] == [7, 21] and (len(p.train), len(p.eval)) == (21, 7)
    from fsdp_tune.output.data import summary_lines  # #48: not "28 sequences" alone when 7 went to evaluation

    assert "  data: 21 of those 28 sequences train, 7 are held out for evaluation (--test_split_size)" in (
        summary_lines(p.report)
    )
    fractions = [{"path": str(a), "fraction": 0.5}, {"path": str(b), "fraction": 0.5, "columns": qa}]
    p = prepared(tmp_path / "f", tok, config=mixture_config(tmp_path, fractions))
    assert [s["used"] for s in p.report["sources"]] == [8, 8]  # TRL's rule: the first rows, nothing repeated


def test_skipped_rows_are_counted_with_their_rows(tmp_path, tok) -> None:
    long_prompt = {"instruction": "word " * 200, "input": "", "output": "short"}
    rows = [*ALPACA[:4], {"instruction": "Q", "input": "", "output": ""}, long_prompt]
    p = prepared(tmp_path, tok, "--dataset_name", str(jsonl(tmp_path / "a.jsonl", rows)))
    skipped = p.report["sources"][0]["skipped"]
    assert skipped["an empty answer"] == {"count": 1, "rows": [f"{tmp_path / 'a.jsonl'} row 5"], "first": "turn 1"}
    assert skipped["the prompt fills max_seq_len: nothing left to learn"]["rows"] == [f"{tmp_path / 'a.jsonl'} row 6"]
    assert len(p.train) == 4


def test_prepared_once_and_read_back(tmp_path, tok, monkeypatch) -> None:
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.worker.data import prepare as prep

    data = jsonl(tmp_path / "a.jsonl", ALPACA)
    spec = plan_run(BASE, ["--output_dir", str(tmp_path / "run"), "--dataset_name", str(data)], print).spec
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match="rank 0 did not prepare the data"):  # never prepared per rank
        prep.prepare(spec, tok)
    monkeypatch.setenv("LOCAL_RANK", "0")
    first = prep.prepare(spec, tok)
    monkeypatch.setattr(prep, "build", lambda *a: pytest.fail("prepared twice"))
    monkeypatch.setenv("LOCAL_RANK", "1")
    again = prep.prepare(spec, tok)
    assert again.train["input_ids"] == first.train["input_ids"] and again.report == first.report


def test_tool_calls_on_a_template_that_does_not_render_them(tmp_path, tok) -> None:
    """Plain ChatML writes no `tool_calls`: the call becomes the answer's text rather than an empty turn."""
    call = '{"name": "mul", "arguments": {"a": 2, "b": 3}}'
    row = {
        "conversations": [
            {"from": "human", "value": "2*3?"},
            {"from": "function_call", "value": call},
            {"from": "observation", "value": "6"},
            {"from": "gpt", "value": "It is 6."},
        ]
    }
    p = prepared(tmp_path, tok, "--dataset_name", str(jsonl(tmp_path / "t.jsonl", [row])))
    assert answers(tok, p.train)[0] == [call + "<|im_end|>", "It is 6.<|im_end|>"]


def test_answers_that_read_as_json_stay_text_where_content_mixes_parts_and_strings(tmp_path, tok) -> None:
    """#48: `content` a list of parts in one row and a string in the others: datasets types it Json and its encoder
    takes "4" for JSON already encoded (the int 4 came back, the template refused the row, and the row was skipped
    on rank 0 after the pre-flight said none would be). Rank 0 now reads what the pre-flight read, row for row; the
    one row this text-only template does refuse (a list of parts) is counted alike, its reason in the summary."""
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.output.data import summary_lines
    from fsdp_tune.sources.sample import read_sample
    from fsdp_tune.worker.data.prepare import prepare
    from fsdp_tune.worker.data.splits import load_split

    texts = ["4", "true", "null", "[1, 2]", "3.50", "Hello"]
    rows = [
        {"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": a}]}
        for i, a in enumerate(texts)
    ]
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}, MULTI[2]]}
    data = jsonl(tmp_path / "mixed.jsonl", [*rows, parts])
    planned = plan_run(BASE, ["--output_dir", str(tmp_path / "run"), "--dataset_name", str(data)], print)
    spec, (counted,) = planned.spec, planned.counted
    (source,) = spec.data.sources
    assert (counted.tokenized["rows"], counted.tokenized["skipped"]) == (7, 1)  # what the plan says
    assert load_split(source, "train").to_list() == [r for _, r in read_sample(str(data), "json").rows]
    p = prepare(spec, tok)
    assert [a[-1] for a in answers(tok, p.train)] == [f"{t}<|im_end|>" for t in texts]  # every answer, as written
    report = p.report["sources"][0]
    assert (report["rows"], report["sequences"]) == (7, 6)
    (said,) = [line for line in summary_lines(p.report) if "skipped" in line]
    assert "skipped 1 row(s): the chat template refuses it" in said and f"{data} row 7" in said
    assert 'TypeError: can only concatenate str (not "list") to str' in said  # the template's own reason
