"""`make test` runs the suite in two pytest processes at once (pytest-xdist, `-n 2 --dist loadfile`): the dist
layer's launches leave a core idle for much of their time (the launcher's plan and torchrun's start on one core,
waits on a timeout or a signal), and the one-process layers fill it.

The units of work: a unit is a test file, so a module's fixtures run once, as in one process. The files with a test
that reads one of the session's shared launches (tests/dist/conftest.py: the reference run, the group launches) are
one unit between them, so each shared launch still runs once. Which files those are, only a worker knows (it
collects: the fixtures each test reads); the controller, which schedules and collects nothing, reads it from the
file the workers write while they collect (tests/conftest.py calls `note_units`). xdist's own grouping does not
work here: xdist 3.8's `--dist loadgroup` tags a group by rewriting `item._nodeid`, which pytest 9.2 no longer
reads (node ids live in `item._id`), so every test became a unit of its own (seen: each shared launch ran twice).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

SHARED = "dist-shared-launches"
_INPUT = "fsdp_tune_units"  # the key of the file's path in what the controller hands each worker


def reads_a_shared_launch(item) -> bool:
    """Whether a test reads a session-wide fixture of the dist layer (directly or through another fixture: the
    closure is the item's). Its file joins SHARED; any other file is a unit of its own."""
    defs = item._fixtureinfo.name2fixturedefs.values()
    return any(d.scope == "session" and d.baseid.startswith("tests/dist") for group in defs for d in group)


def note_units(config, items) -> None:
    """In an xdist worker: write which tests share a unit (every worker writes the same; the last one stays)."""
    path = getattr(config, "workerinput", {}).get(_INPUT)
    if path:
        # the whole file: a test may ask for a launch by name (request.getfixturevalue), out of the closure
        files = {item.nodeid.partition("::")[0] for item in items if reads_a_shared_launch(item)}
        shared = {item.nodeid: SHARED for item in items if item.nodeid.partition("::")[0] in files}
        tmp = f"{path}.{os.getpid()}"
        Path(tmp).write_text(json.dumps(shared))
        os.replace(tmp, path)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """The controller: one file for the whole run, named to every worker."""
    config = node.config
    if not hasattr(config, "_fsdp_tune_units"):
        fd, config._fsdp_tune_units = tempfile.mkstemp(prefix="fsdp-tune-units-", suffix=".json")
        os.close(fd)
    node.workerinput[_INPUT] = config._fsdp_tune_units


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the shared launches' tests in one unit."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Units(LoadFileScheduling):
        _shared: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._shared is None:  # first asked once every worker has collected (and written the file)
                path = Path(config._fsdp_tune_units)
                self._shared = json.loads(path.read_text() or "{}")
                path.unlink(missing_ok=True)
            return self._shared.get(nodeid) or super()._split_scope(nodeid)

    return Units(config, log)
