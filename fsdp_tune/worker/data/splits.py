"""A source's split as a `datasets.Dataset`, read the way the launcher located it (Source.loader and .files):
local json/csv/tsv/parquet/arrow files and folders, `save_to_disk` folders, or a Hub dataset (offline from the
local cache) with its config, data_dir and data_files; split slices (`train[:5%]`) everywhere."""

from __future__ import annotations

from collections.abc import Callable

from datasets import DatasetDict, ReadInstruction, concatenate_datasets, load_dataset, load_from_disk

from fsdp_tune.sources.formats import Format, detect_format, renders_to_text
from fsdp_tune.sources.mixture import Source, split_name

DETECT_ROWS = 100


def load_split(source: Source, split: str):
    name = split_name(split)
    if source.loader == "disk":
        dataset = _sliced(_from_disk(source.files[name][0], name), split, name)
    elif source.loader:
        files = source.files[name]
        kwargs = _as_text(files) if source.loader == "csv" else {}
        dataset = load_dataset(source.loader, data_files={name: files}, split=split, **kwargs)
        if source.loader == "json":
            dataset = _as_written(dataset, files, split, name)
    else:
        dataset = load_dataset(
            source.path, name=source.name, data_dir=source.data_dir, data_files=source.data_files, split=split
        )
    if source.columns:
        dataset = dataset.select_columns(list(source.columns))
    return dataset


def _as_text(files: list[str]) -> dict:
    """CSV/TSV cells read as text, as the launcher's pre-flight reads them (csv.DictReader): an answer `2` stays
    "2" (pandas would make the column int, and every row would be skipped as prompt and completion of
    different kinds), and `NA` or an empty cell stays that text. The columns are the first file's header (the
    files of a split share them: PF019)."""
    import csv

    from datasets import Features, Value

    delimiter = "\t" if all(f.lower().endswith(".tsv") for f in files) else ","
    with open(files[0], newline="", encoding="utf-8-sig") as f:
        header = next(csv.reader(f, delimiter=delimiter), [])
    features = Features({column: Value("string") for column in header})
    return {"delimiter": delimiter, "features": features, "keep_default_na": False}


def _as_written(dataset, files: list[str], split: str, name: str):
    """The rows as the files hold them, as the pre-flight reads them (sources/sample.py), where `datasets` would
    change them: a field whose values mix kinds (a message's `content` a list of parts in image rows and a string
    in text-only rows) is typed Json, and its encoder keeps a string that parses as JSON as if it were encoded
    already, so an answer "4" comes back as the int 4, "true" as True, "null" as None (datasets 5.2,
    utils/json.py json_encode_field). Such a column is read again with json.loads and handed over encoded by us,
    whole; the other columns keep the types datasets gave them. Data without mixed fields is untouched."""
    import json

    from datasets import Dataset, Features, Json
    from datasets.utils.json import get_json_field_paths_from_feature

    mixed = {path[0] for path in get_json_field_paths_from_feature(dataset.features)}
    if not mixed:
        return dataset
    from fsdp_tune.sources.sample import every_json_row

    rows = [row for f in files for row in every_json_row(f)]
    features = Features({c: Json() if c in mixed else t for c, t in dataset.features.items()})
    columns = {c: [json.dumps(row.get(c)) if c in mixed else row.get(c) for row in rows] for c in dataset.column_names}
    return _sliced(Dataset.from_dict(columns, features=features), split, name)


def _from_disk(folder: str, name: str):
    loaded = load_from_disk(folder)
    return loaded[name] if isinstance(loaded, DatasetDict) else loaded


def _sliced(dataset, spec: str, name: str):
    """A slice of a `load_from_disk` dataset, read by datasets' own parser (load_dataset does it itself)."""
    if spec.strip() == name:
        return dataset
    parts = ReadInstruction.from_spec(spec).to_absolute({name: len(dataset)})
    return concatenate_datasets([dataset.select(range(p.from_, p.to)) for p in parts])


def format_of(source: Source, dataset, text_field: str, peft_text_field: str | None) -> tuple[Format, bool]:
    """(the format, every token trained): the launcher's detection, or rank 0's for a Hub dataset."""
    if source.detected is not None:
        return source.detected, source.train_on_prompt
    rows = dataset.select(range(min(DETECT_ROWS, len(dataset)))).to_list()
    fmt = detect_format(
        dataset.column_names, rows, forced=source.format, column_map=source.column_map, text_field=text_field
    )
    fmt, as_text = renders_to_text(fmt, dataset.column_names, peft_text_field)
    return fmt, source.train_on_prompt or as_text


def detected(source: Source, dataset, detect: Callable[..., Format]) -> Format:
    """The launcher's detection, or rank 0's for a Hub dataset: `detect(columns, rows, forced=, column_map=)` on its
    first DETECT_ROWS rows (sources/preference.py detect_preference, sources/prompts.py detect_prompts)."""
    if source.detected is not None:
        return source.detected
    rows = dataset.select(range(min(DETECT_ROWS, len(dataset)))).to_list()
    return detect(dataset.column_names, rows, forced=source.format, column_map=source.column_map)
