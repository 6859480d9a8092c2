"""The data settings as flags and recipe keys (TRL's spellings), the rules about them (FT100-FT106), and what
reaches the rank spec."""

from __future__ import annotations

import pytest
import yaml

from fsdp_tune.config.writers import render
from fsdp_tune.validate import check
from tests.conftest import checked_spec

BASE = ["--output_dir", "/tmp/x", "--dataset_name", "data/train.jsonl"]


def _spec(*flags: str, config: str | None = None):
    return checked_spec(*BASE, *flags, config=config)


def test_single_dataset_flags_reach_the_source() -> None:
    spec, _ = _spec(
        *(
            "--dataset_format",
            "sharegpt",
            "--dataset_columns",
            "conversations=chat",
            "--dataset_roles",
            "bot=assistant",
        ),
        *("--dataset_config", "en", "--dataset_train_split", "train[:5%]", "--dataset_test_split", "validation"),
        *(
            "--data_files",
            "a.jsonl",
            "b.jsonl",
            "--data_dir",
            "shards",
            "--train_on_inputs",
            "--mask_fallback",
            "locate",
        ),
    )
    (s,) = spec.data.sources
    assert (s.format, s.column_map, s.roles, s.name) == (
        "sharegpt",
        {"conversations": "chat"},
        {"bot": "assistant"},
        "en",
    )
    assert (s.split, s.eval_split, s.data_files, s.data_dir) == (
        "train[:5%]",
        "validation",
        ("a.jsonl", "b.jsonl"),
        "shards",
    )
    assert s.train_on_prompt and spec.data.mask_fallback == "locate"
    spec, _ = _spec("--splits", "train,dev")
    assert (spec.data.sources[0].split, spec.data.sources[0].eval_split) == ("train", "dev")


def test_trl_loss_switches_are_read_as_train_on_prompt() -> None:
    spec, checked = _spec("--completion_only_loss", "false")
    assert spec.data.sources[0].train_on_prompt and "completion_only_loss" not in spec.trainer_args.kwargs()
    assert [f.rule for f in checked.warnings] == ["FT103"]
    spec, checked = _spec("--assistant_only_loss", "true")
    assert not spec.data.sources[0].train_on_prompt and "assistant_only_loss" not in spec.trainer_args.kwargs()
    spec, _ = _spec("--assistant_only_loss", "true", "--train_on_prompt")
    assert spec.data.sources[0].train_on_prompt  # ours wins, and FT103 says so


@pytest.mark.parametrize(
    "flags,padded",
    [((), None), (("--pad_to_multiple_of", "auto"), None), (("--pad_to_multiple_of", "8"), 8)]
    + [(("--pad_to_multiple_of", "None"), None)],
)
def test_pad_to_multiple_of_reaches_the_spec_as_sftconfig_resolves_it(flags, padded) -> None:
    """TRL's default is "auto" (a multiple of 128 on Neuron only), a command line gives a string: the ranks'
    collators read the number SFTConfig would pad to (the vision collator pads with it)."""
    spec, _ = _spec(*flags)
    assert spec.data.pad_to_multiple_of == padded


CP2 = ("--num_processes", "2", "--use_parallelism_config", "--parallelism_config_cp_size", "2")
CP2 += ("--parallelism_config_dp_shard_size", "1")


@pytest.mark.parametrize(
    "flags,padded", [((), 4), (("--pad_to_multiple_of", "3"), 12), (("--pad_to_multiple_of", "8"), 8)]
)
def test_context_parallelism_pads_every_batch_to_its_chunks(flags, padded) -> None:
    """Under cp_size 2 torch's load balancer cuts every sequence into 2 x 2 chunks: batches are padded to a multiple
    of 4 (with the user's multiple: their least common multiple), in the collator's SFTConfig and the spec's data."""
    spec, _ = _spec(*CP2, *flags)
    assert spec.data.pad_to_multiple_of == spec.trainer_args.pad_to_multiple_of == padded
    assert spec.parallelism.cp_size == 2


def _rules(*flags: str, config: str | None = None) -> list[tuple[str, str]]:
    return [(f.rule, f.severity.value) for f in check(config, [*BASE, *flags]).findings if f.rule.startswith("FT10")]


@pytest.mark.parametrize(
    "flags,expected",
    [
        (("--dataset_streaming",), [("FT104", "error")]),
        (("--dataset_kwargs", '{"skip_prepare_dataset": true}'), [("FT104", "error")]),
        (("--test_split_size", "1.5"), [("FT104", "error")]),
        (("--pad_to_multiple_of", "eight"), [("FT104", "error")]),
        (("--pad_to_multiple_of", "0"), [("FT104", "error")]),
        (("--pad_to_multiple_of", "8"), []),
        (("--pad_to_multiple_of", "none"), []),
        (("--dataset_columns", "questoin=q"), [("FT105", "error")]),
        (("--dataset_roles", "bot=robot"), [("FT105", "error")]),
        (("--splits", "train,test", "--dataset_test_split", "validation"), [("FT102", "warning")]),
    ],
)
def test_data_rules(flags, expected) -> None:
    assert _rules(*flags) == expected


def test_a_mixture_in_trls_form(tmp_path) -> None:
    recipe = {
        "datasets": [
            {"path": "a.jsonl", "weight": 2, "format": "alpaca"},
            {"path": "acme/chat", "name": "en", "split": "train[:10%]", "columns": ["messages"]},
        ],
        "data": {"test_split_size": 0.1},
        "training": {"eval_strategy": "steps"},
    }
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(recipe))
    spec, checked = _spec(config=str(path))
    assert [s.path for s in spec.data.sources] == ["a.jsonl", "acme/chat"] and spec.data.test_split_size == 0.1
    assert spec.data.sources[1].columns == ("messages",) and spec.data.sources[0].weight == 2
    assert [(f.rule, f.key) for f in checked.warnings] == [("FT101", "--dataset_name")]  # the mixture wins
    again = tmp_path / "again.yaml"
    again.write_text(render(checked.config, "recipe"))  # `fsdp-tune convert` keeps it
    assert check(str(again), BASE).config.data.datasets == checked.config.data.datasets
    recipe["datasets"][0]["samples"] = 3
    recipe["datasets"].append("just a string")
    del recipe["data"]
    path.write_text(yaml.safe_dump(recipe))
    assert _rules(config=str(path)) == [
        ("FT100", "error"),
        ("FT100", "error"),
        ("FT101", "warning"),
        ("FT106", "error"),
    ]
