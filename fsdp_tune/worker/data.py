"""Datasets per rank: load the splits, apply the chat template, hand TRL a text or chat dataset."""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.datasource import resolve


def load_splits(cfg: RunConfig, tokenizer):
    """(train, eval or None), already rendered to `dataset_text_field` when a chat template is chosen."""
    from datasets import DatasetDict, load_dataset

    splits = cfg.data.splits or ("train",)
    source = resolve(cfg.data.dataset_name or "", splits)
    if source.is_local:
        files = {split: str(path) for split, path in source.files.items()}
        loaded = load_dataset(source.loader, data_files=files)
    else:
        loaded = DatasetDict({s: load_dataset(source.name, split=s) for s in splits})
    train = loaded[splits[0]]
    evaluation = loaded[splits[1]] if len(splits) > 1 and splits[1] in loaded else None
    render = _renderer(cfg, tokenizer)
    if render is not None:
        train = train.map(render, remove_columns=train.column_names, desc="chat template")
        if evaluation is not None:
            evaluation = evaluation.map(render, remove_columns=evaluation.column_names, desc="chat template")
    return train, evaluation


def _renderer(cfg: RunConfig, tokenizer):
    """With --chat_template_format, `messages` become one text per row in dataset_text_field (as PEFT's
    examples do); otherwise TRL applies the tokenizer's own template to `messages`, or uses the text."""
    if cfg.data.chat_template_format == "none":
        return None
    field = cfg.data.dataset_text_field

    def render(row):
        if "messages" in row and row["messages"] is not None:
            return {field: tokenizer.apply_chat_template(row["messages"], tokenize=False)}
        return {field: row[field]}

    return render


def truncated_rows(dataset, max_len: int, packing: bool) -> tuple[int, int]:
    """(sequences cut at max_len, all sequences) in the dataset as TRL prepared it.

    TRL cuts every sequence longer than max_length, silently (without packing it truncates the row; with
    BFD packing it truncates the sequence before packing it). A sequence that is now exactly max_len long
    was cut or fitted exactly; either way the data meets the limit, so it is counted.
    """
    import pyarrow.compute as pc

    # Arrow compute over the column (respecting shuffles and filters): no per-row Python, so a dataset of
    # millions of rows costs a fraction of a second, not a copy of every token id in Python lists
    if packing and "seq_lengths" in dataset.column_names:
        lengths = pc.list_flatten(dataset.with_format("arrow")["seq_lengths"])
    elif "input_ids" in dataset.column_names:
        lengths = pc.list_value_length(dataset.with_format("arrow")["input_ids"])
    else:
        return 0, 0
    cut = pc.sum(pc.greater_equal(lengths, max_len)).as_py() or 0
    return int(cut), len(lengths)
