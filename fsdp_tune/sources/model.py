"""What a model is made of, read from files on this machine without importing torch or transformers.

The model's config.json comes from where `plan` finds it (a local folder or file, a reference config we
ship, builtin:NAME) or from the Hugging Face cache; never from the network. Its architecture's classes
and submodule names come from the text of transformers' `modeling_<type>.py`, located with
importlib's find_spec (which imports nothing). Anything not found gives None: callers then skip their
check rather than guess (remote-code models, an uncached hub id).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# Reference config.json files of common models, shipped as package data (no download, no torch)
REFERENCE = "fsdp_tune.sources.reference"

_CLASS = re.compile(r"^class (\w+)\(", re.M)
_SUBMODULE = re.compile(r"\bself\.(\w+)\s*=\s*(?:nn\.)?(\w*)\(")
_NO_SPLIT = re.compile(r"_no_split_modules\s*=\s*\[([^\]]*)\]")


@dataclass(frozen=True)
class ModelSource:
    model_type: str
    modeling_file: str
    classes: frozenset[str]
    submodules: frozenset[str]  # attribute names assigned a module-like call (q_proj, gate_proj, lm_head ...)
    linears: frozenset[str]  # those built by a *Linear / Conv1D call: what LoRA adapts
    no_split_modules: tuple[str, ...]  # the decoder-layer classes FSDP wraps by default


def hf_home() -> Path:
    return Path(os.environ.get("HF_HOME", "~/.cache/huggingface"))


def hub_cache() -> Path:
    return Path(os.environ.get("HF_HUB_CACHE") or hf_home() / "hub")


def hub_cached(repo_id: str, kind: str) -> bool:
    """A repository of `kind` ("models", "datasets") in the Hub cache."""
    return (hub_cache().expanduser() / f"{kind}--{repo_id.replace('/', '--')}").is_dir()


def offline(*variables: str) -> bool:
    """Any of these environment switches (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, ...) is on."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in variables)


def find_config(name: str) -> tuple[str, dict]:
    """(where from, config dict) for a local dir, a config.json path, a hub id we ship, or builtin:NAME."""
    if name.startswith("builtin:"):
        from fsdp_tune.sources.builtin import PRESETS

        preset = PRESETS.get(name.removeprefix("builtin:"))
        if preset is None:
            raise FileNotFoundError(name)  # not a builtin (rule FT085 says so)
        return name, {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "tie_word_embeddings": False,
            "max_position_embeddings": 2048,
            **preset,
        }
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        path = path / "config.json"
    if path.is_file():
        return str(path), read_json(path)
    index = _reference("index.json")
    if name in index:
        return f"{index[name]} (fsdp-tune's reference config for {name})", _reference(index[name])
    raise FileNotFoundError(name)


def model_config(name: str) -> dict | None:
    try:
        return find_config(name)[1]
    except (FileNotFoundError, KeyError, ValueError, OSError):
        pass
    snapshots = hub_cache().expanduser() / f"models--{name.replace('/', '--')}" / "snapshots"
    for cfg in sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            return read_json(cfg)
        except (OSError, ValueError):
            continue
    return None


# One command asks for the same config.json many times (the rules, the rank spec, every variant the planner
# tries): each file is parsed once per version of it, and every caller gets its own copy.
def read_json(path: Path) -> dict:
    stat = path.stat()
    return copy.deepcopy(_parsed(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    return json.loads(Path(path).read_text())


def _reference(file: str) -> dict:
    return copy.deepcopy(_reference_parsed(file))


@functools.cache
def _reference_parsed(file: str) -> dict:
    """A reference config shipped as package data (it does not change while the process runs)."""
    return json.loads(resources.files(REFERENCE).joinpath(file).read_text())


def code_files(name: str) -> list[str] | None:
    """The Python files that come with a model (what trust_remote_code imports on every rank): *.py in its
    local folder or newest cached snapshot, and the modules its config.json's auto_map names (`repo--module`
    for code in another repository). None when the model is not on this machine."""
    folder = Path(name).expanduser()
    if not folder.is_dir():
        snapshots = hub_cache().expanduser() / f"models--{name.replace('/', '--')}" / "snapshots"
        found = sorted(snapshots.glob("*"), key=lambda p: p.stat().st_mtime, reverse=True) if snapshots.is_dir() else []
        if not found:
            return None
        folder = found[0]
    files = sorted(p.name for p in folder.glob("*.py"))
    try:
        auto_map = json.loads((folder / "config.json").read_text()).get("auto_map") or {}
    except (OSError, ValueError, AttributeError):
        auto_map = {}
    for ref in auto_map.values():
        for target in ref if isinstance(ref, list) else [ref]:
            if isinstance(target, str) and "." in target:
                module = target.rpartition(".")[0].replace("--", ": ") + ".py"
                if module not in files:
                    files.append(module)
    return files


def for_model(name: str | None) -> ModelSource | None:
    """The model's classes and submodules; a composite model's (a vision-language model: its own modeling file,
    and those of its text and vision sub-configs' types, as LLaVA builds a Llama and a CLIP inside) together."""
    if not name:
        return None
    config = model_config(name)
    if not config or not isinstance(config.get("model_type"), str):
        return None
    main = _read(config["model_type"])
    subs = [
        _read(sub["model_type"])
        for key in ("text_config", "vision_config")
        if isinstance(sub := config.get(key), dict) and isinstance(sub.get("model_type"), str)
    ]
    parts = [p for p in subs if p is not None and main is not None and p.modeling_file != main.modeling_file]
    if main is None or not parts:
        return main
    return ModelSource(
        model_type=main.model_type,
        modeling_file=main.modeling_file,
        classes=main.classes.union(*(p.classes for p in parts)),
        submodules=main.submodules.union(*(p.submodules for p in parts)),
        linears=main.linears.union(*(p.linears for p in parts)),
        no_split_modules=main.no_split_modules or tuple(c for p in parts for c in p.no_split_modules),
    )


@functools.lru_cache(maxsize=16)
def _read(model_type: str) -> ModelSource | None:
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = Path(list(spec.submodule_search_locations)[0]) / "models"
    module = _module_name(models, model_type)
    path = models / module / f"modeling_{module}.py"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8", errors="replace")
    assignments = _SUBMODULE.findall(text)
    no_split: tuple[str, ...] = ()
    found = _NO_SPLIT.search(text)
    if found:
        no_split = tuple(re.findall(r"[\"'](\w+)[\"']", found.group(1)))
    return ModelSource(
        model_type=model_type,
        modeling_file=str(path),
        classes=frozenset(_CLASS.findall(text)),
        submodules=frozenset(name for name, call in assignments if call != "Parameter"),  # modules, not tensors
        linears=frozenset(name for name, call in assignments if "Linear" in call or call == "Conv1D"),
        no_split_modules=no_split,
    )


def _module_name(models: Path, model_type: str) -> str:
    """transformers' model_type_to_module_name, from its mapping's text."""
    mappings = models / "auto" / "auto_mappings.py"
    if mappings.is_file():
        special = re.search(rf"\(\"{re.escape(model_type)}\",\s*\"(\w+)\"\)", _special_block(mappings))
        if special:
            return special.group(1)
    return model_type.replace("-", "_")


@functools.lru_cache(maxsize=1)
def _special_block(mappings: Path) -> str:
    text = mappings.read_text(encoding="utf-8", errors="replace")
    start = text.find("SPECIAL_MODEL_TYPE_TO_MODULE_NAME")
    return text[start : text.find("\n)", start)] if start >= 0 else ""
