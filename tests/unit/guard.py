"""The unit layer's promise, held in any pytest process: a unit test never imports torch or the HF stack.

When the lib or dist layers ran first in the same process, torch already sits in `sys.modules` and a plain
`import torch` would be answered from there unseen. So for each unit test the heavy packages are taken out of
`sys.modules` (with every already-imported fsdp_tune module that holds one of them), and a finder first on
`sys.meta_path` refuses and records any load of them (finding one without loading it stays allowed); all is
put back after the test. An import that the code under test catches (`try: import torch except ImportError`) is
recorded too: it fails the test all the same.
"""

from __future__ import annotations

import importlib.abc
import sys
import types
from contextlib import contextmanager

from fsdp_tune.rundir.manifest import PACKAGES as HEAVY  # the stack a run records: what the launcher never loads


def _heavy(name: str) -> bool:
    return name.partition(".")[0] in HEAVY


class HeavyImport(ModuleNotFoundError):
    pass


class _Refuser(importlib.abc.MetaPathFinder):
    """Finds a heavy package where the other finders would (so `importlib.util.find_spec`, which the launcher
    uses to read a library's source as text, still answers) and hands out a loader that refuses to load it."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if not _heavy(name):
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Refuser) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _RefusingLoader(self)
                return spec
        return None


class _RefusingLoader(importlib.abc.Loader):
    def __init__(self, refuser: _Refuser) -> None:
        self.refuser = refuser

    def create_module(self, spec):
        self.refuser.attempts.append(spec.name)
        raise HeavyImport(
            f"the unit layer imported {spec.name!r}: keep the import lazy on the launcher side, or move the test "
            "to tests/lib or tests/dist",
            name=spec.name,
        )

    def exec_module(self, module) -> None:  # never reached: create_module refuses
        raise HeavyImport(module.__name__)


@contextmanager
def no_heavy_imports():
    """Within the block no heavy package can be imported; yields the list of attempted imports (empty on exit
    when none was tried)."""
    stashed = {
        name: mod
        for name, mod in list(sys.modules.items())
        if mod is not None and (_heavy(name) or (name.partition(".")[0] == "fsdp_tune" and heavy_globals(mod)))
    }
    for name in stashed:
        del sys.modules[name]
    refuser = _Refuser()
    sys.meta_path.insert(0, refuser)
    try:
        yield refuser.attempts
    finally:
        sys.meta_path.remove(refuser)
        for name in [n for n in sys.modules if _heavy(n)]:  # nothing should be here; leave no half-import
            del sys.modules[name]
        sys.modules.update(stashed)


def heavy_globals(module: types.ModuleType) -> list[str]:
    """The heavy modules among a module's globals: what a test module imported at its top (at collection, before
    any guard), or what an already-imported fsdp_tune module holds."""
    found = {v.__name__ for v in list(vars(module).values()) if isinstance(v, types.ModuleType) and _heavy(v.__name__)}
    return sorted(found)
