"""The user's reward function imported from what the launcher resolved (RewardSpec: a file or a module, and the
function's name), by the probe before launch and by every rank. The user's code runs because the user named it."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from fsdp_tune.rewards.guard import RewardError
from fsdp_tune.rewards.resolve import RewardSpec


def module_name(path: Path) -> str:
    """The name a reward file is imported under: its stem and its folder's hash (two my_rewards.py in two folders
    are two modules)."""
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"fsdp_tune_rewards_{path.stem}_{digest}"


def load_function(spec: RewardSpec):
    """The callable `spec` names; RewardError (one line: the entry and what failed) when it cannot be had."""
    if spec.search_path and spec.search_path not in sys.path:
        sys.path.insert(0, spec.search_path)
    try:
        if spec.target.endswith(".py"):
            path = Path(spec.target)
            name = module_name(path)
            module = sys.modules.get(name)
            if module is None:
                found = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(found)
                sys.modules[name] = module
                found.loader.exec_module(module)
        else:
            module = importlib.import_module(spec.target)
    except Exception as e:  # noqa: BLE001 - the user's module, whatever its import raises
        sys.modules.pop(module_name(Path(spec.target)), None)
        raise RewardError(f"reward {spec.written}: importing {spec.target} failed: {type(e).__name__}: {e}") from e
    func = getattr(module, spec.attr or "", None)
    if func is None:
        raise RewardError(f"reward {spec.written}: {spec.target} has no {spec.attr} once imported")
    if not callable(func):
        raise RewardError(f"reward {spec.written}: {spec.attr} is a {type(func).__name__}, not a function")
    return func
