"""Shared test helpers. Tests run offline: nothing may reach a model or dataset hub.

The tests come in layers, a folder and a marker each (`make test-unit`, `test-lib`, `test-dist`, `test-gpu`;
`make test` runs them all, in two pytest processes at once: tests/workers.py):
  tests/unit   unit:  no torch, no processes (tests/unit/conftest.py asserts it): the launcher side
  tests/lib    lib:   one process with the libraries (torch, transformers, PEFT, TRL, datasets)
  tests/dist   dist:  real multi-process runs through torchrun on CPU (gloo), with bounded timeouts
  tests/gpu    gpu:   needs CUDA; skipped without it
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.seeds import seed_flags  # noqa: F401 - re-exported for the tests
from tests.workers import note_units, pytest_configure_node, pytest_xdist_make_scheduler  # noqa: F401 - xdist's hooks

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# a scheduler's variables would place every `train` of the suite in its job (fsdp_tune/schedulers/topology.py):
# the tests that mean a scheduler set its variables themselves
for _name in [n for n in os.environ if n.startswith(("SLURM_", "SLURMD_", "PET_", "SKYPILOT_"))]:
    del os.environ[_name]

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
# Real-world Accelerate configs from other projects (copied from ../shared/peer-configs: CI runs them)
PEER_CONFIGS = FIXTURES / "peer-configs"


LAYERS = ("unit", "lib", "dist", "gpu")


def pytest_collection_modifyitems(config, items) -> None:
    """Each test carries its layer's marker (its folder's name), so `-m` selects layers across a run."""
    for item in items:
        layer = Path(str(item.fspath)).resolve().relative_to(REPO / "tests").parts[0]
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))
    note_units(config, items)  # `make test`'s two processes: which tests share a launch (tests/workers.py)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    """One builtin model per test session, shared by every run (as on a user's machine)."""
    cache = os.environ.get("FSDP_TUNE_TEST_CACHE")
    return Path(cache) if cache else tmp_path_factory.mktemp("fsdp-tune-cache")


def offline_env(model_cache: Path) -> dict[str, str]:
    """The environment every `fsdp-tune` command of the tests runs in: offline, the session's model cache."""
    return dict(
        os.environ,
        FSDP_TUNE_CACHE=str(model_cache),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_DATASETS_CACHE=str(model_cache / "datasets"),
    )


def checked_spec(*flags: str, machine=None, config: str | None = None):
    """(the rank spec `train` decides for a config and flags on `machine`, the check it came from); this
    machine's CPU when no machine is given. A launch with errors is refused, as `train` refuses it."""
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.validate import check

    checked = check(config, list(flags))
    assert not checked.errors, checked.findings
    return decide(checked.config, machine or Machine.cpu_only()), checked


def spec_for(*flags: str, machine=None, config: str | None = None):
    """The rank spec `train` decides (checked_spec, without the check)."""
    return checked_spec(*flags, machine=machine, config=config)[0]


def hub_snapshot(hub: Path, repo_id: str, commit: str = "a" * 40) -> Path:
    """Where the Hugging Face cache at `hub` holds `repo_id` at `commit`, as `hf download` leaves it: refs/main names
    the commit (written here); the snapshot folder itself is the caller's to fill."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit
