"""The data part of the rank spec: which datasets, which splits, which format was asked for, what is in the
loss; and what the files themselves say (the files of a folder, the detected format), from the data files read
once (`read_files`, decide/datafiles.py), a decide-stage input like the Machine. The pre-flight checks those same
rows and never writes the spec.
"""

from __future__ import annotations

import math

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide import datafiles
from fsdp_tune.decide.derived import Derived, cp_degree, evaluation
from fsdp_tune.decide.spec import DataSpec
from fsdp_tune.sources.mixture import Source, from_entry, mixture_problems


def data_spec(cfg: RunConfig, derived: Derived, files: tuple[datafiles.Look, ...] | None = None) -> DataSpec:
    """`files`: what the data files say (read_files); None: the sources as asked (`plan`, `--emit`: not read)."""
    d = cfg.data
    asked = sources(cfg, derived.train_on_prompt)
    settled = tuple(look.settled(s) for look, s in zip(files, asked, strict=True)) if files is not None else asked
    return DataSpec(
        dataset_name=d.dataset_name or "",
        splits=tuple(d.splits or ("train",)),
        text_field=d.dataset_text_field,
        max_seq_len=d.max_seq_len,
        packing=d.packing,
        seed=derived.data_seed,
        sources=settled,
        test_split_size=d.test_split_size,
        mask_fallback=d.mask_fallback,
        peft_text_field=peft_text_field(cfg),
        # as the method's config reads them (its default when unset; a config without the field: TRL's SFT one)
        truncation_mode=cfg.training.get("truncation_mode") or "keep_start",
        packing_strategy=cfg.training.get("packing_strategy") or "bfd",
        eos_token=cfg.training.get("eos_token"),
        num_proc=cfg.training.get("dataset_num_proc"),
        pad_to_multiple_of=batch_multiple(cfg),
    )


def read_files(cfg: RunConfig) -> tuple[datafiles.Look, ...]:
    """Every local source's files, read once: located, sampled, their format detected (decide/datafiles.py)."""
    eval_wanted = evaluation(cfg) and not cfg.data.test_split_size
    asked = sources(cfg, False)  # where the rows are; what is trained on is decided in data_spec
    return datafiles.read(asked, cfg.data.dataset_text_field, peft_text_field(cfg), eval_wanted, cfg.run.method)


def batch_multiple(cfg: RunConfig) -> int | None:
    """What every batch's length is padded to a multiple of: the user's pad_to_multiple_of, and under context
    parallelism 2 x cp_size as well (torch's head-tail load balancing cuts every sequence into 2 x cp chunks; a
    length it cannot cut leaves the ranks with different shard lengths, and the ring's collectives then mismatch).
    FT048 keeps max_seq_len a multiple of 2 x cp_size, so the padding never passes it."""
    asked = pad_multiple(cfg.training.get("pad_to_multiple_of"))
    cp = cp_degree(cfg)
    if cp == 1:
        return asked
    return math.lcm(asked or 1, 2 * cp)


def pad_multiple(value: object) -> int | None:
    """SFTConfig's pad_to_multiple_of as its __post_init__ resolves it: "auto" (its default) pads only on Neuron,
    never where fsdp-tune runs; "none"/"null" do not pad; a number, as a string from a command line too. Anything
    else raises ValueError, as SFTConfig would on the ranks (FT104 refuses it first)."""
    if value is None or value == "auto" or (isinstance(value, str) and value.lower() in ("none", "null")):
        return None
    if isinstance(value, bool):
        raise ValueError(value)
    number = int(value)  # type: ignore[call-overload]
    if number < 1 or (isinstance(value, float) and value != number):
        raise ValueError(value)
    return number


def peft_text_field(cfg: RunConfig) -> str | None:
    """PEFT's examples/sft (the seed scripts): with a chat template chosen, --dataset_text_field names the text
    the chats are rendered into, trained on every token; an explicit --train_on_prompt decides instead."""
    d = cfg.data
    if (
        d.chat_template_format != "none"
        and cfg.is_set("data.dataset_text_field")
        and not cfg.is_set("data.train_on_prompt")
    ):
        return d.dataset_text_field
    return None


def split_names(cfg: RunConfig) -> tuple[str, str | None]:
    """(train split, eval split or None): TRL's --dataset_train_split/--dataset_test_split win over --splits."""
    splits = cfg.data.splits or ("train",)
    train = cfg.data.dataset_train_split or splits[0]
    return train, cfg.data.dataset_test_split or (splits[1] if len(splits) > 1 else None)


def sources(cfg: RunConfig, everything: bool) -> tuple[Source, ...]:
    """The Sources of the run; `everything`: --train_on_prompt as decide/derived.py reads it."""
    d = cfg.data
    if d.datasets:
        if mixture_problems(list(d.datasets)):
            return ()  # refused by FT100
        return tuple(from_entry(entry, everything) for entry in d.datasets)
    if not d.dataset_name:
        return ()
    train, test = split_names(cfg)
    return (
        Source(
            path=d.dataset_name,
            split=train,
            eval_split=test,
            name=d.dataset_config,
            data_dir=d.data_dir,
            data_files=d.data_files,
            column_map=dict(d.dataset_columns or {}),
            roles=dict(d.dataset_roles or {}),
            format=d.dataset_format,
            train_on_prompt=everything,
        ),
    )
