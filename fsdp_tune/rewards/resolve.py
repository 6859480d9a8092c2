"""What a `--reward_funcs` entry names, found without running anything (the launcher stays torch-free, and no user
code runs in `validate-config`):

    length_reward, accuracy_reward, ...   a built-in (rewards/builtin.py)
    my_rewards.py:exact_match             a function in a Python file (relative to the working directory)
    pkg.mod:fn, pkg.mod.fn                a function in an importable module (TRL's own spelling is the second)
    runs/rm                               a folder: a `--method reward` run (its adapter on its base), or a
                                          sequence classifier saved with save_pretrained

A file or module is located on disk (packages are not imported to find their modules) and read with `ast`: the
function must be defined (or imported) at its top level. Importing it and calling it on one row of the data is the
pre-flight's (rewards/probe.py, in a subprocess: the user's code may import torch).
"""

from __future__ import annotations

import ast
import difflib
import importlib.machinery
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fsdp_tune.config.folders import FolderRefused, check_adapter
from fsdp_tune.config.methods import row_of
from fsdp_tune.rewards.builtin import BUILTINS
from fsdp_tune.runfiles import ADAPTER_CONFIG, RESOLVED_NAME
from fsdp_tune.sources.model import model_config


@dataclass(frozen=True)
class RewardSpec:
    """One GRPO reward, as the launcher resolved and checked it (rewards/resolve.py); the ranks build its callable
    (worker/training/rewards.py); part of the rank spec
    (decide/spec.py GenerationSpec)."""

    name: str  # what TRL logs it as (rewards/NAME/mean): the function's name, or the reward model's folder name
    # "builtin" (rewards/builtin.py) | "python" (the user's) | "reward_run" (a --method reward run's adapter on its
    # base) | "reward_model" (a sequence classifier's folder)
    kind: Literal["builtin", "python", "reward_run", "reward_model"]
    target: str  # the builtin's name, the .py file (absolute), the module, or the folder (absolute)
    written: str  # as the user wrote it (--reward_funcs), for messages
    attr: str | None = None  # the function's name in the file or module (python)
    search_path: str | None = None  # put first on sys.path before importing (the file's folder, or the launch cwd)


class Unresolved(ValueError):
    """An entry that names nothing usable: the message says what was looked for, the hint what to write."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def resolve(entry: str, cwd: str | None = None) -> RewardSpec:
    cwd = cwd or os.getcwd()
    if entry in BUILTINS:
        return RewardSpec(name=entry, kind="builtin", target=entry, written=entry)
    folder = Path(entry).expanduser()
    folder = folder if folder.is_absolute() else Path(cwd) / folder
    if folder.is_dir():
        return _folder(entry, folder)
    if ":" in entry:
        where, attr = entry.rsplit(":", 1)
        if where.endswith(".py") or "/" in where or os.sep in where:
            return _in_file(entry, where, attr, cwd)
        return _in_module(entry, where, attr, cwd)
    if "." in entry and not entry.endswith(".py"):
        module, attr = entry.rsplit(".", 1)
        return _in_module(entry, module, attr, cwd)
    close = difflib.get_close_matches(entry, BUILTINS, n=1)
    raise Unresolved(
        f"{entry!r} is not a built-in reward, a folder, or a function (file.py:function, package.module.function)",
        f"--reward_funcs {close[0]}" if close else f"a built-in ({', '.join(BUILTINS)}), or my_rewards.py:my_function",
    )


def _folder(entry: str, folder: Path) -> RewardSpec:
    """A reward model: a --method reward run of fsdp-tune's, or a sequence classifier's folder."""
    resolved = folder / RESOLVED_NAME
    if resolved.exists() and (folder / ADAPTER_CONFIG).exists():
        try:
            method = json.loads(resolved.read_text())["spec"].get("method", "sft")
        except (OSError, ValueError, KeyError, TypeError):
            method = None
        # the rank spec's MethodSpec (a spec of version 2 named the method alone)
        name = method.get("name") if isinstance(method, dict) else method
        head = method.get("head") if isinstance(method, dict) else row_of(str(name)).head
        if head != "score":
            raise Unresolved(
                f"{entry} is a --method {name} run, not a reward model: its adapter generates text",
                "a --method reward run's folder (fsdp-tune train --method reward ...)",
            )
        try:  # bounded before PEFT reads it on the ranks (config/folders.py: the loader door's rules)
            check_adapter(folder)
        except FolderRefused as e:
            raise Unresolved(str(e), e.hint) from None
        return RewardSpec(name=folder.name, kind="reward_run", target=str(folder.resolve()), written=entry)
    config = model_config(str(folder))  # the model door (sources/model.py)
    archs = (config or {}).get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        what = f"its architectures are {', '.join(archs)}" if archs else "it has no config.json with architectures"
        raise Unresolved(
            f"{entry} is a folder but not a reward model ({what})",
            "a --method reward run's folder, or a sequence classifier saved with save_pretrained",
        )
    if (config or {}).get("num_labels", 1) != 1 and len((config or {}).get("id2label") or {0: 0}) != 1:
        raise Unresolved(f"{entry} scores with {len(config['id2label'])} labels; a reward is one", "a one-label model")
    return RewardSpec(name=folder.name, kind="reward_model", target=str(folder.resolve()), written=entry)


def _in_file(entry: str, where: str, attr: str, cwd: str) -> RewardSpec:
    path = Path(where).expanduser()
    path = path if path.is_absolute() else Path(cwd) / path
    if not path.is_file():
        raise Unresolved(
            f"{where} does not exist (looked in {path.parent})", "give the file's path: path/to/file.py:fn"
        )
    _defined(entry, path, attr)
    path = path.resolve()
    return RewardSpec(attr, "python", str(path), entry, attr=attr, search_path=str(path.parent))


def _in_module(entry: str, module: str, attr: str, cwd: str) -> RewardSpec:
    origin = module_file(module, [cwd, *sys.path[1:]])
    if origin is None:
        raise Unresolved(
            f"no module {module} on the Python path (nor in {cwd})",
            f"run from the folder that holds it, install it, or name the file: {module.replace('.', '/')}.py:{attr}",
        )
    if origin.endswith(".py"):
        _defined(entry, Path(origin), attr)
    return RewardSpec(attr, "python", module, entry, attr=attr, search_path=cwd)


def module_file(name: str, paths: list[str]) -> str | None:
    """The file module `name` would be imported from, found without importing its packages."""
    search: list[str] | None = paths
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or []) or None
        if search is None and i < len(parts) - 1:
            return None
    return spec.origin if spec is not None else None


def _defined(entry: str, path: Path, attr: str) -> None:
    """`attr` is defined or imported at the top level of `path` (a module with a __getattr__ or a star import may
    provide it too: the probe finds out)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise Unresolved(f"{path}:{e.lineno}: {entry}: the file does not parse ({e.msg})", "fix the file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise Unresolved(f"{path}: cannot be read ({e})", "check the file") from None
    names: set[str] = set()
    dynamic = False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            dynamic |= any(a.name == "*" for a in node.names)
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    dynamic |= "__getattr__" in names
    if attr not in names and not dynamic:
        functions = sorted(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        close = difflib.get_close_matches(attr, functions, n=1)
        raise Unresolved(
            f"{path} defines no {attr} (its functions: {', '.join(functions) or 'none'})",
            f"--reward_funcs {entry.rsplit(attr, 1)[0]}{close[0]}" if close else "name a function the file defines",
        )
