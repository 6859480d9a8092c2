"""The loader door's rules (config/folders.py), without torch: a safetensors header read through one bounded reader,
an adapter's config bounded before PEFT sees it, a regex target that could backtrack without bound refused (#46)."""

from __future__ import annotations

import json
import re
import struct
import time

import pytest

from fsdp_tune.config.folders import (
    MAX_RANK,
    FolderRefused,
    adapter_problems,
    check_adapter,
    code_configs,
    read_header,
    regex_problem,
)

pytestmark = pytest.mark.unit

GOOD = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}


def safetensors(path, header: bytes | None = None, length: int | None = None, tail: bytes = b"\0" * 16):
    header = json.dumps(GOOD).encode() if header is None else header
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + tail)
    return path


HOSTILE_HEADERS = {
    "a number": (b"5", None, "not a table of tensors"),
    "nested 100,000 deep": (b"[" * 100_000 + b"]" * 100_000, None, "nested too deep"),
    "2^40 bytes long": (b"{}", 2**40, "claims 1,099,511,627,776 bytes"),
    "a shape that is an int": (b'{"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}}', None, "shape 4"),
    "an unknown dtype": (b'{"w": {"dtype": "Q7", "shape": [4], "data_offsets": [0, 16]}}', None, "dtype 'Q7'"),
    "not JSON": (b"{nope", None, "not valid JSON"),
}


@pytest.mark.parametrize("case", HOSTILE_HEADERS, ids=list(HOSTILE_HEADERS))
def test_a_hostile_safetensors_header_is_refused_naming_the_file(tmp_path, case) -> None:
    header, length, said = HOSTILE_HEADERS[case]
    path = safetensors(tmp_path / "adapter_model.safetensors", header, length)
    started = time.monotonic()
    with pytest.raises(FolderRefused) as refused:
        read_header(path)
    assert time.monotonic() - started < 2
    assert str(path) in str(refused.value) and said in str(refused.value), str(refused.value)
    assert refused.value.exit_code == 2


def test_a_whole_header_reads_and_a_fifo_is_no_file(tmp_path) -> None:
    import os

    assert read_header(safetensors(tmp_path / "a.safetensors")) == GOOD
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(FolderRefused, match="not a regular file"):
        read_header(fifo)  # would block forever in open()/read()


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ({"r": 1_000_000_000}, "r 1000000000: a LoRA rank is a whole number from 1, at most 4096"),
        ({"r": 0}, "r 0"),
        ({"r": "8"}, "r 8: a LoRA rank"),
        ({"rank_pattern": {"q_proj": 10**6}}, "rank_pattern['q_proj'] 1000000"),
        ({"lora_alpha": float("inf")}, "lora_alpha inf"),
        ({"lora_alpha": 1e30}, "lora_alpha 1e+30"),
        ({"lora_dropout": 1.5}, "lora_dropout 1.5"),
        ({"target_modules": "(.*.*)*Q"}, "can backtrack without bound"),
        ({"target_modules": "(a|aa)*$"}, "can backtrack without bound"),
        ({"target_modules": ".*" * 5}, "5 unbounded quantifiers"),
        ({"target_modules": "q" * 5000}, "5000 characters"),
        ({"target_modules": "(["}, "not a regular expression"),
        ({"exclude_modules": "(x+)+y"}, "exclude_modules"),
        ({"rank_pattern": {"(a+)+": 4}}, "rank_pattern key"),
        ({"target_modules": ["q_proj"] * 20_000}, "a list of at most 10,000"),
    ],
)
def test_an_absurd_adapter_config_is_refused_before_peft(config, said) -> None:
    problems = adapter_problems({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], **config})
    assert problems and said in problems[0], problems


def test_the_largest_rank_passes() -> None:
    assert not adapter_problems({"r": MAX_RANK}) and adapter_problems({"r": MAX_RANK + 1})


@pytest.mark.parametrize(
    "pattern",
    [
        r".*\.(q_proj|v_proj)",
        r"model\.layers\.\d+\.self_attn\.(q|k|v)_proj",
        r"^(?!.*vision).*(q_proj|v_proj)$",
        r".*(q|v)_proj",
        r"(?:.*\.)?(gate|up|down)_proj",
        r"model.layers.*.mlp.*",
        # decide/vision.py's exclude_modules: one branch per frozen part, two unbounded quantifiers each
        r"(?:(?:.*\.)?model\.visual\.merger(?:\..*)?)|(?:(?:.*\.)?model\.visual\.blocks(?:\..*)?)|(?:(?:.*\.)?x)",
    ],
)
def test_the_regexes_peft_users_write_pass(pattern) -> None:
    assert regex_problem(pattern) is None


def test_what_the_regex_rule_lets_through_matches_fast() -> None:
    """The worst the rule accepts (three unbounded quantifiers that cannot match) against a long module name:
    polynomial, not exponential (the refused `(.*.*)*Q` does not finish on 30 characters)."""
    worst = ".*.*.*Q"
    assert regex_problem(worst) is None
    name = "model.layers.31.self_attn.q_proj.lora_A.default" * 2
    started = time.monotonic()
    assert re.fullmatch(worst, name) is None
    assert time.monotonic() - started < 1


def test_an_adapter_folder_is_checked_whole(tmp_path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "target_modules": ["q_proj"]}))
    safetensors(tmp_path / "adapter_model.safetensors", b"5")
    with pytest.raises(FolderRefused, match="adapter_model.safetensors: its header is not a table"):
        check_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text("[" * 50_000 + "]" * 50_000)
    with pytest.raises(FolderRefused, match="adapter_config.json: JSON nested too deep"):
        check_adapter(tmp_path)


def test_the_files_that_ask_for_code_are_found(tmp_path) -> None:
    assert code_configs(tmp_path, {"model_type": "llama"}, "config.json") == {}
    tokenizer = {"auto_map": {"AutoTokenizer": ["t.Tok", None]}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    assert code_configs(tmp_path, {"model_type": "llama"}, "config.json") == {"tokenizer_config.json": tokenizer}
    config = {"model_type": "mine", "auto_map": {"AutoModel": "m.Model"}}  # the model door's read of config.json
    assert list(code_configs(tmp_path, config, "config.json")) == ["config.json", "tokenizer_config.json"]


def test_a_reward_runs_adapter_is_bounded_before_the_ranks_read_it(tmp_path) -> None:
    from fsdp_tune.rewards.resolve import Unresolved, resolve

    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 8, "task_type": "SEQ_CLS"}))
    spec = {"spec": {"method": {"name": "reward", "head": "score"}}}
    (tmp_path / "fsdp_tune_resolved.json").write_text(json.dumps(spec))
    safetensors(tmp_path / "adapter_model.safetensors", b"{}", 2**40)
    with pytest.raises(Unresolved, match="adapter_model.safetensors: its header claims"):
        resolve(str(tmp_path))


def test_the_exclude_modules_fsdp_tune_writes_pass() -> None:
    """decide/vision.py's exclude_modules (every frozen part of a vision model, and the user's list) is read back
    through the rule when its run's adapter is opened: it must pass however many parts there are."""
    from fsdp_tune.decide.vision import _excluded

    parts = [f"model.visual.blocks.{i}" for i in range(40)] + ["model.multi_modal_projector"]
    assert regex_problem(_excluded(parts, ["lm_head", "embed_tokens"])) is None
