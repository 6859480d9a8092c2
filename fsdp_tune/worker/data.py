"""Datasets per rank: load the splits, apply the chat template, hand TRL a text or chat dataset."""

from __future__ import annotations

from fsdp_tune.launch.spec import DataSpec
from fsdp_tune.sources.data import resolve


def load_splits(data: DataSpec, tokenizer):
    """(train, eval or None), already rendered to `dataset_text_field` when a chat template is chosen."""
    from datasets import DatasetDict, load_dataset

    splits = data.splits or ("train",)
    source = resolve(data.dataset_name, splits)
    if source.is_local:
        files = {split: str(path) for split, path in source.files.items()}
        loaded = load_dataset(source.loader, data_files=files)
    else:
        loaded = DatasetDict({s: load_dataset(source.name, split=s) for s in splits})
    train = loaded[splits[0]]
    evaluation = loaded[splits[1]] if len(splits) > 1 and splits[1] in loaded else None
    render = _renderer(data, tokenizer)
    if render is not None:
        train = train.map(render, remove_columns=train.column_names, desc="chat template")
        if evaluation is not None:
            evaluation = evaluation.map(render, remove_columns=evaluation.column_names, desc="chat template")
    return train, evaluation


def _renderer(data: DataSpec, tokenizer):
    """With --chat_template_format, `messages` become one text per row in dataset_text_field (as PEFT's
    examples do); otherwise TRL applies the tokenizer's own template to `messages`, or uses the text."""
    if data.chat_template_format == "none":
        return None
    field = data.text_field

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

    Lengths come from the Arrow list offsets with numpy: no per-row Python (a million-row dataset is not
    copied into lists on every rank), and no pyarrow.compute, whose thread pool can abort the process at
    exit ("terminate called without an active exception", apache/arrow#34314).
    """
    import numpy as np

    column = "seq_lengths" if packing and "seq_lengths" in dataset.column_names else "input_ids"
    if column not in dataset.column_names:
        return 0, 0
    chunks = dataset.data.column(column).chunks
    if column == "seq_lengths":  # packed rows: every row is kept, order does not matter; count the sequences
        lengths = np.concatenate([c.flatten().to_numpy() for c in chunks] or [np.zeros(0, np.int64)])
    else:
        lengths = np.concatenate([np.diff(c.offsets.to_numpy()) for c in chunks] or [np.zeros(0, np.int64)])
        indices = getattr(dataset, "_indices", None)  # TRL's filter and shuffle: the rows it kept
        if indices is not None:
            lengths = lengths[indices.column(0).to_numpy()]
    return int((lengths >= max_len).sum()), len(lengths)
