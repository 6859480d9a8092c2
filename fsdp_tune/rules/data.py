"""Data settings: the dataset mixture, split names, column and role maps, and TRL's own loss switches."""

from __future__ import annotations

from collections.abc import Iterator

from fsdp_tune.config.methods import row_of
from fsdp_tune.config.schema import RunConfig
from fsdp_tune.decide.data import pad_multiple
from fsdp_tune.decide.derived import TRL_LOSS_FLAGS, evaluation, train_on_prompt
from fsdp_tune.errors import Finding
from fsdp_tune.rules.registry import error, rule, warning
from fsdp_tune.sources.convert import STANDARD_ROLES
from fsdp_tune.sources.formats import ALL_FIELDS
from fsdp_tune.sources.mixture import mixture_problems

# settings of the single dataset (--dataset_name) that a `datasets:` mixture replaces (each entry has its own)
SINGLE_DATASET = (
    "dataset_name",
    "dataset_config",
    "data_files",
    "data_dir",
    "dataset_format",
    "dataset_columns",
    "dataset_roles",
    "dataset_train_split",
    "dataset_test_split",
)


@rule("FT100", "data", "a `datasets:` mixture entry that cannot be read")
def mixture_entries(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.data.datasets is None:
        return
    if not cfg.data.datasets:
        yield error(cfg, "FT100", "data.datasets", "the mixture is empty", "list at least one `- path: FILE`")
    for problem in mixture_problems(list(cfg.data.datasets)):
        yield error(
            cfg,
            "FT100",
            "data.datasets",
            problem,
            "each entry: path, and optionally name, data_dir, data_files, split, columns, fraction (TRL), "
            "or weight / samples, format, roles",
        )


@rule("FT101", "data", "single-dataset settings next to a `datasets:` mixture")
def single_and_mixture(cfg: RunConfig) -> Iterator[Finding]:
    if not cfg.data.datasets:
        return
    for name in SINGLE_DATASET:
        if cfg.is_set(f"data.{name}"):
            yield warning(
                cfg,
                "FT101",
                f"data.{name}",
                "ignored: the `datasets:` mixture names the data (as TRL's sft script does)",
                "set it per entry (path, name, data_files, split, format, columns, roles), or drop it",
            )


@rule("FT102", "data", "--splits and TRL's split names disagree")
def split_names(cfg: RunConfig) -> Iterator[Finding]:
    d = cfg.data
    if not cfg.is_set("data.splits"):
        return
    for index, name in ((0, "dataset_train_split"), (1, "dataset_test_split")):
        value = getattr(d, name)
        given = d.splits[index] if len(d.splits) > index else None
        if value is not None and value != given:
            yield warning(
                cfg,
                "FT102",
                f"data.{name}",
                f"{value} wins over {cfg.where('data.splits')} = {','.join(d.splits)}",
                "keep one of the two spellings",
            )


@rule("FT103", "data", "TRL's loss switches, read as --train_on_prompt")
def trl_loss_switches(cfg: RunConfig) -> Iterator[Finding]:
    everything = train_on_prompt(cfg)
    if row_of(cfg.run.method).preference:
        return  # SFTConfig's own switches: another method's config refuses them (FT110)
    for name in TRL_LOSS_FLAGS:
        if not cfg.training.is_set(name) or cfg.training.get(name) is None:
            continue
        how = (
            f"--train_on_prompt {str(cfg.data.train_on_prompt).lower()} decides"
            if cfg.is_set("data.train_on_prompt")
            else f"read as --train_on_prompt {str(everything).lower()}"
        )
        yield warning(
            cfg,
            "FT103",
            f"training.{name}",
            f"fsdp-tune computes the answer masks itself for every format and chat template (no {{% generation %}} "
            f"markers needed): {how}",
            f"drop --{name}; the answers alone are trained by default, --train_on_prompt trains every token",
        )


@rule("FT104", "data", "data options the prepared dataset cannot honour")
def refused_data_options(cfg: RunConfig) -> Iterator[Finding]:
    if cfg.data.dataset_streaming:
        yield error(
            cfg,
            "FT104",
            "data.dataset_streaming",
            "streaming is not supported: rank 0 converts and tokenizes the data once and the other ranks read it",
            "drop --dataset_streaming (a slice such as --dataset_train_split 'train[:10%]' trains on a part)",
        )
    if (cfg.training.get("dataset_kwargs") or {}).get("skip_prepare_dataset"):
        yield error(
            cfg,
            "FT104",
            "training.dataset_kwargs",
            "skip_prepare_dataset would drop the answer masks (TRL builds the labels from them)",
            "drop skip_prepare_dataset from --dataset_kwargs",
        )
    pad = cfg.training.get("pad_to_multiple_of")
    try:
        pad_multiple(pad)
    except (TypeError, ValueError):
        yield error(
            cfg,
            "FT104",
            "training.pad_to_multiple_of",
            f"{pad!r} is not a padding multiple: SFTConfig takes a whole number of tokens, auto or none",
            "--pad_to_multiple_of 8 (or leave it unset: auto, no padding off Neuron)",
        )
    size = cfg.data.test_split_size
    if size is not None and not 0 < size < 1:
        yield error(cfg, "FT104", "data.test_split_size", f"must be between 0 and 1, got {size}", "test_split_size 0.1")


@rule("FT105", "data", "column and role maps name things fsdp-tune does not know")
def column_and_role_maps(cfg: RunConfig) -> Iterator[Finding]:
    fields = sorted(ALL_FIELDS)
    unknown = sorted(set(cfg.data.dataset_columns or {}) - set(fields))
    if unknown:
        yield error(
            cfg,
            "FT105",
            "data.dataset_columns",
            f"unknown field(s) {', '.join(unknown)}",
            f"map one of {', '.join(fields)} to your column: --dataset_columns prompt=question",
        )
    bad = {k: v for k, v in (cfg.data.dataset_roles or {}).items() if v not in STANDARD_ROLES}
    if bad:
        yield error(
            cfg,
            "FT105",
            "data.dataset_roles",
            "roles must be one of "
            + ", ".join(STANDARD_ROLES)
            + f"; got {', '.join(f'{k}={v}' for k, v in bad.items())}",
            "--dataset_roles bot=assistant,person=user",
        )


@rule("FT106", "data", "evaluation without held-out data")
def eval_needs_data(cfg: RunConfig) -> Iterator[Finding]:
    if not evaluation(cfg) or not cfg.data.datasets or cfg.data.test_split_size:
        return
    yield error(
        cfg,
        "FT106",
        "training.eval_strategy",
        "a `datasets:` mixture is evaluated on rows held out from it (TRL's test_split_size), and none is set",
        "test_split_size: 0.1 in the `data:` section, or --test_split_size 0.1",
    )


@rule("FT107", "data", "builtin:NAME must be a dataset fsdp-tune ships")
def builtin_dataset(cfg: RunConfig) -> Iterator[Finding]:
    import difflib

    from fsdp_tune.sources.data import BUILTIN

    named = [("data.dataset_name", cfg.data.dataset_name)]
    named += [("data.datasets", e.get("path")) for e in cfg.data.datasets or () if isinstance(e, dict)]
    for path, name in named:
        if not isinstance(name, str) or not name.startswith("builtin:") or name in BUILTIN:
            continue
        closest = difflib.get_close_matches(name, list(BUILTIN), n=1, cutoff=0.3)
        yield error(
            cfg,
            "FT107",
            path,
            f"{name} is not a dataset fsdp-tune ships; the builtins are {', '.join(BUILTIN)}",
            f"{closest[0] if closest else next(iter(BUILTIN))}, or your own file (see README: Your data)",
        )
