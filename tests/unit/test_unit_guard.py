"""The unit layer's guard fires in any process: also when torch was imported before (the lib and dist layers ran
first in this pytest process), and also when the code under test catches the ImportError."""

from __future__ import annotations

import sys
import types

import pytest

from tests.unit.guard import HeavyImport, heavy_globals, no_heavy_imports


@pytest.fixture
def torch_already_imported():
    """A stand-in torch in sys.modules, and a launcher-side module that holds it, as after a lib test."""
    fake, holder = types.ModuleType("torch"), types.ModuleType("fsdp_tune._guard_probe")
    holder.torch = fake
    sys.modules.update({"torch": fake, "fsdp_tune._guard_probe": holder})
    yield fake
    for name in ("torch", "fsdp_tune._guard_probe"):
        sys.modules.pop(name, None)


def test_an_import_answered_from_sys_modules_is_refused(torch_already_imported) -> None:
    with no_heavy_imports() as attempts:
        assert "torch" not in sys.modules and "fsdp_tune._guard_probe" not in sys.modules
        with pytest.raises(HeavyImport, match="the unit layer imported 'torch'"):
            import torch  # noqa: F401
        with pytest.raises(HeavyImport):
            __import__("transformers.models")
    assert attempts == ["torch", "transformers"]  # a submodule loads its package first
    assert sys.modules["torch"] is torch_already_imported  # put back after the block


def test_a_caught_import_is_recorded() -> None:
    with no_heavy_imports() as attempts:
        try:
            import peft  # noqa: F401
        except ImportError:
            pass
    assert attempts == ["peft"]


def test_a_module_importing_torch_at_its_top_is_named() -> None:
    module = types.ModuleType("tests.unit.test_probe")
    module.torch, module.json = types.ModuleType("torch"), sys.modules["json"]
    assert heavy_globals(module) == ["torch"]


def test_finding_a_package_without_loading_it_is_allowed() -> None:
    """The launcher reads transformers' modeling files as text (sources/model.py): find_spec, no import."""
    import importlib.util

    with no_heavy_imports() as attempts:
        spec = importlib.util.find_spec("transformers")
        assert spec is not None and spec.submodule_search_locations
    assert attempts == []
