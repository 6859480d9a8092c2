"""Table-driven: every fixture config + flags raises exactly the rule ids its row names (tests/fixtures/cases.yaml):
no more, no fewer, errors and warnings alike."""

from __future__ import annotations

import pytest
import yaml

from fsdp_tune.validate import check
from tests.conftest import FIXTURES

CASES = yaml.safe_load((FIXTURES / "cases.yaml").read_text())


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c['file']}{' ' + ' '.join(map(str, c['flags'])) if c['flags'] else ''}"
)
def test_case(case: dict) -> None:
    checked = check(str(FIXTURES / "configs" / case["file"]), [str(f) for f in case["flags"]])
    errors = {f.rule for f in checked.errors}
    warnings = {f.rule for f in checked.warnings}
    assert errors == set(case["expect"]), checked.findings
    assert warnings == set(case.get("warn", [])), checked.findings
    for f in checked.errors:
        assert f.key and f.source and f.message, f  # every error names a key, where it came from, and why
        assert f.hint or f.rule in ("FT072",), f"{f.rule} has no fix: {f}"


FORMATS = {"accel": "accelerate", "tf": "transformers", "recipe": "recipe"}  # a fixture's name says its format
ELSEWHERE = {"accel_launch_env.yaml": "tests/unit/test_train_command.py (the ranks' environment)"}


def test_every_format_is_covered_and_read_as_named() -> None:
    """Each of the three formats has rows, every fixture file is in the table (or checked elsewhere, named
    here), and each is read by the reader its name says (a misdetected file would pass its rows by luck)."""
    files = sorted(p.name for p in (FIXTURES / "configs").iterdir())
    assert {c["file"] for c in CASES} | set(ELSEWHERE) == set(files)
    assert {FORMATS[c["file"].split("_")[0]] for c in CASES} == set(FORMATS.values())
    read_as = {name: check(str(FIXTURES / "configs" / name), []).format for name in files}
    assert read_as == {name: FORMATS[name.split("_")[0]] for name in files}


def test_a_section_that_is_not_a_mapping(tmp_path) -> None:
    """FT003, for each place a mapping is expected, reported with its key and file."""
    from fsdp_tune.validate import check

    cases = {
        "accel.yaml": "distributed_type: FSDP\nfsdp_config: [fsdp_version]\ndynamo_config: inductor\n",
    }
    found = {}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        found[name] = sorted(f.key for f in check(str(tmp_path / name), []).findings if f.rule == "FT003")
    assert found == {"accel.yaml": ["dynamo_config", "fsdp_config"]}
