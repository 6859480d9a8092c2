"""The versions fsdp-tune is tested with (sources/versions.py): pyproject.toml declares exactly them, a library
outside them is named at launch before any rank starts (PF029: a warning, a refusal where the CPU shim would
break), and `fsdp-tune env` says which are in range. The version reader is monkeypatched: no library is installed
or imported here."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.sources import versions
from fsdp_tune.sources.versions import FACTS, RANGES, Range
from tests.conftest import FIXTURES, REPO

runner = CliRunner()
BASE = str(FIXTURES / "tiny_lora.yaml")


def _pinned(path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower()] = version.strip()
    return pins


def test_pyproject_declares_exactly_the_tested_ranges() -> None:
    import tomllib

    declared = {}
    for dep in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)(.*)", dep).groups()
        declared[name.lower()] = spec
    assert {name: declared[name] for name in RANGES} == {name: r.requirement() for name, r in RANGES.items()}


@pytest.mark.parametrize("file,end", [("constraints.txt", "high"), ("constraints-low.txt", "low")])
def test_each_end_of_a_range_is_a_pinned_set(file: str, end: str) -> None:
    """The lowest set is constraints-low.txt (.venv-low), the pinned one constraints.txt: each inside every range,
    and each range's low end is the low set's version."""
    pins = _pinned(REPO / file)
    for name, r in RANGES.items():
        assert pins[name] in r, (file, name, pins[name], r.text())
        if end == "low" and name != "torch":  # torch's low end is the GPU image's 2.11 (RANGES says where it ran)
            assert versions.major_minor(pins[name]) == r.low, (name, pins[name])


def test_ranges_and_facts() -> None:
    assert "5.17.0" in RANGES["transformers"] and "5.25.0" in RANGES["transformers"]
    assert "5.16.1" not in RANGES["transformers"] and "5.26.0" not in RANGES["transformers"]
    assert "2.13.0+cpu" in RANGES["torch"] and "2.11.0+cu130" in RANGES["torch"] and "2.14.0" not in RANGES["torch"]
    assert None not in RANGES["peft"]
    assert Range((5, 17), (5, 25)).requirement() == ">=5.17,<5.26" and Range((1, 16), (1, 16)).text() == "1.16"
    shim = FACTS["cpu_shim"]
    assert shim.library == "accelerate" and "1.16.0" in shim.range and "1.17.0" not in shim.range


def _installed(monkeypatch, **found: str) -> None:
    pins = _pinned(REPO / "constraints.txt")
    monkeypatch.setattr(versions, "installed", lambda name: found.get(name, pins.get(name)))


def test_messages_name_the_tested_range(monkeypatch) -> None:
    _installed(monkeypatch, transformers="5.26.0", accelerate="1.17.0")
    assert [(n, f) for n, f, _ in versions.outside()] == [("transformers", "5.26.0"), ("accelerate", "1.17.0")]
    assert versions.range_message("transformers", "5.26.0") == (
        "transformers 5.26.0 is outside the versions fsdp-tune is tested with (transformers 5.17 to 5.25)"
    )
    assert versions.fact_holds("cpu_shim") == (False, "1.17.0")
    assert "checked against accelerate 1.12 to 1.16; accelerate 1.17.0 is installed" in versions.fact_message(
        "cpu_shim", "1.17.0"
    )
    assert 'pip install "accelerate>=1.15,<1.17"' in versions.fact_hint("cpu_shim")


def test_a_cpu_run_on_an_accelerate_the_shim_was_not_checked_against_is_refused_before_launch(
    monkeypatch, tmp_path
) -> None:
    _installed(monkeypatch, accelerate="1.17.0")
    r = runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o")])
    assert r.exit_code == 2 and "PF029" in r.output, r.output
    assert "accelerate 1.12 to 1.16; accelerate 1.17.0 is installed" in r.output, r.output
    assert r.output.count("PF029") == 1, r.output  # the refusal, not a warning beside it
    assert not (tmp_path / "o").exists()


def test_a_library_outside_its_range_is_a_warning_before_launch(monkeypatch, tmp_path) -> None:
    _installed(monkeypatch, transformers="5.26.0")
    r = runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dry_run", "--json"])
    assert r.exit_code == 0, r.output
    assert "PF029" in r.output and "transformers 5.26.0 is outside" in r.output and "5.17 to 5.25" in r.output


def test_in_range_libraries_say_nothing(monkeypatch, tmp_path) -> None:
    _installed(monkeypatch)
    r = runner.invoke(app, ["train", "--config", BASE, "--output_dir", str(tmp_path / "o"), "--dry_run", "--json"])
    assert r.exit_code == 0 and "PF029" not in r.output, r.output


def test_env_lists_each_version_in_range_or_not(monkeypatch) -> None:
    from fsdp_tune.output.tables import format_info

    _installed(monkeypatch, transformers="5.26.0")
    found = versions.versions()
    info = {"versions": found, "tested": versions.tested(found)}  # what tools/envinfo.py collect() gives
    text = format_info(info)
    assert "transformers           5.26.0  (tested 5.17 to 5.25: OUTSIDE the tested range)" in text, text
    assert "accelerate             1.15.0  (tested 1.15 to 1.16: in range)" in text, text
    json.dumps(info)


def test_make_test_low_refuses_a_venv_off_its_constraints(monkeypatch) -> None:
    """make test-low's first line (python -m fsdp_tune.sources.versions constraints-low.txt): the low tests never
    pass on the wrong set."""
    _installed(monkeypatch)  # constraints.txt's set
    assert versions.matches(str(REPO / "constraints.txt")) == []
    assert versions.matches(str(REPO / "constraints-low.txt")) == ["transformers 5.24.0 (pinned 5.17.0)"]
