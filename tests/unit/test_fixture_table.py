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


def test_every_format_is_covered() -> None:
    names = {c["file"].split("_")[0] for c in CASES}
    assert names == {"accel", "tf", "recipe"}


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
