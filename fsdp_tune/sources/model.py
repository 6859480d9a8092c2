"""What a model is made of, read from files on this machine without importing torch or transformers.

The model's config.json comes from where `plan` finds it (a local folder or file, a reference config we
ship, builtin:NAME) or from the Hugging Face cache; never from the network. Its architecture's classes
and submodule names come from the text of transformers' `modeling_<type>.py`, located with
importlib's find_spec (which imports nothing). Anything not found gives None: callers then skip their
check rather than guess (remote-code models, an uncached hub id).
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.util
import json
import os
import re
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fsdp_tune.config import folders

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
    """huggingface_hub's HF_HOME: $HF_HOME, else $XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface."""
    default = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(os.environ.get("HF_HOME") or default).expanduser()


def hub_cache() -> Path:
    """huggingface_hub's HF_HUB_CACHE (its constants.py, read at each call rather than at its import)."""
    given = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(given).expanduser() if given else hf_home() / "hub"


def hub_cached(repo_id: str, kind: str) -> bool:
    """A repository of `kind` ("models", "datasets") in the Hub cache."""
    return (hub_cache() / f"{kind}--{repo_id.replace('/', '--')}").is_dir()


def offline(*variables: str) -> bool:
    """Any of these environment switches (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, ...) is on."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes") for v in variables)


# The model door. Where a model's files are, and its config.json, are found here and nowhere else
# (tests/unit/test_model_door.py): decide/derived.py resolves them once into `Derived.model`, the rank spec carries
# them (`ModelSpec.facts`), and the rules, the pre-flight and the trace read that value.
CONFIG = "config.json"
Where = Literal["builtin", "local", "cache", "reference", "absent"]


@dataclass(frozen=True)
class ModelFacts:
    """Where a model's files are on this machine and its config.json as read there.

    `where`: "local" (a folder or a config.json file the user named), "cache" (the Hugging Face cache, by hub id),
    "reference" (a config fsdp-tune ships for a hub id not on this machine), "builtin" (builtin:NAME) or "absent".
    """

    where: Where
    path: str | None = None  # absolute: the local folder or file, the cache's snapshot folder, the reference file
    config: dict[str, Any] | None = None  # its config.json; None when absent or unreadable (`problem`)
    problem: str | None = None  # a config.json that is there but unreadable: "is not valid JSON (line 1, ...)"

    @property
    def found(self) -> bool:
        return self.config is not None

    @property
    def config_file(self) -> str | None:
        """The config.json read (a local or cached model's)."""
        if self.path is None or self.where not in ("local", "cache"):
            return None
        return self.path if self.path.endswith(".json") else str(Path(self.path) / CONFIG)

    def describe(self, name: str) -> str:
        """Where the config came from, for a plan's header."""
        if self.where == "reference":
            return f"{Path(self.path or '').name} (fsdp-tune's reference config for {name})"
        if self.where == "cache":
            return f"{name} in the Hugging Face cache ({self.path})"
        return self.config_file or name


def model_facts(name: str | None, revision: str | None = None) -> ModelFacts:
    """The door: a model's files and config.json, from a local folder or file, the Hugging Face cache (by hub id,
    at `revision` or refs/main, as `hf download` leaves it), a reference config fsdp-tune ships, or builtin:NAME.
    Never the network. Each config.json is parsed once per version of the file (read_json)."""
    if not name:
        return ModelFacts("absent")
    if name.startswith("builtin:"):
        return _builtin(name)
    path = Path(name).expanduser()
    if path.is_dir() or path.is_file():
        path = path.resolve()
        file = path / CONFIG if path.is_dir() else path
        return _with_config(ModelFacts("local", str(path)), file)
    snapshot = _snapshot(name, revision)
    if snapshot is not None:
        return _with_config(ModelFacts("cache", str(snapshot)), snapshot / CONFIG)
    index = _reference("index.json")
    if name in index:
        return ModelFacts("reference", str(resources.files(REFERENCE).joinpath(index[name])), _reference(index[name]))
    return ModelFacts("absent")


def reference_names() -> list[str]:
    """The hub ids fsdp-tune ships a config for."""
    return sorted(_reference("index.json"))


def not_found(name: str, facts: ModelFacts) -> tuple[str, str]:
    """(what is missing, how to get it) for a model whose config the door did not find, as `plan` and `--emit` say
    it: a hub id names the cache it looked in, the nearest reference configs (else all of them) and the download."""
    if facts.problem:
        return f"{facts.config_file} {facts.problem}", "restore the config.json the model came with"
    if facts.where == "local":
        return (
            f"{name} has no config.json: not a Transformers model folder",
            "point at the folder save_pretrained wrote",
        )
    if name.startswith("builtin:"):
        return f"unknown builtin model {name}", "see fsdp-tune train --help for the builtin models"
    known = reference_names()
    near = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    listed = f"the nearest: {', '.join(near)}" if near else f"they are: {', '.join(known)}"
    return (
        f"no config for {name}: not a local folder, not in the Hugging Face cache ({hub_cache()}), and not among "
        f"fsdp-tune's reference configs ({listed})",
        f"hf download {name} --include config.json (then read from the cache), or point at a local model folder",
    )


def fetch_config(name: str, revision: str | None = None) -> dict[str, Any] | None:
    """A model's config.json from this machine, else downloaded from the Hub (the after-run tools: `merge` and
    `chat` on a base they may have to fetch anyway); None when neither answers."""
    facts = model_facts(name, revision)
    if facts.found or facts.where == "local":
        return facts.config
    try:
        from huggingface_hub import hf_hub_download

        return read_json(Path(hf_hub_download(name, CONFIG, revision=revision)))
    except Exception:  # noqa: BLE001 - offline, unknown repository, gated: no config
        return None


def _builtin(name: str) -> ModelFacts:
    from fsdp_tune.sources.builtin import PRESETS

    preset = PRESETS.get(name.removeprefix("builtin:"))
    if preset is None:
        return ModelFacts("absent")  # not a builtin (rule FT085 says so)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "tie_word_embeddings": False,
        "max_position_embeddings": 2048,
        **preset,
    }
    return ModelFacts("builtin", None, config)


def _with_config(facts: ModelFacts, file: Path) -> ModelFacts:
    """`facts` with its config.json read, or the reason it cannot be."""
    if not file.is_file():
        return facts
    try:
        config = read_json(file)
    except folders.FolderRefused as refused:
        e = refused.__cause__
        if isinstance(e, json.JSONDecodeError):
            return replace(facts, problem=f"is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})")
        return replace(facts, problem=str(refused).removeprefix(f"{file}: "))
    except OSError as e:
        return replace(facts, problem=f"cannot be read ({e.strerror or e})")
    if not isinstance(config, dict):
        return replace(facts, problem="is not a JSON object")
    return replace(facts, config=config)


def _snapshot(repo_id: str, revision: str | None) -> Path | None:
    """The cache's snapshot folder for `repo_id` (huggingface_hub's layout: models--org--name/refs/<revision> holds
    a commit hash, snapshots/<hash>/ the files), as try_to_load_from_cache finds it; else the newest snapshot with
    a config.json. None when the model is not in the cache."""
    if repo_id.count("/") > 1 or repo_id.startswith((".", "/", "~")):
        return None
    repo = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else revision
    if commit and (snapshots / commit / CONFIG).is_file():
        return snapshots / commit
    if revision:
        return None  # that revision is not cached: not another one in its place
    found = sorted(snapshots.glob(f"*/{CONFIG}"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0].parent if found else None


def model_config(name: str | None) -> dict | None:
    """The model's config.json as the door finds it (None: not on this machine)."""
    return model_facts(name).config


# One command asks for the same config.json many times (the rules, the rank spec, every variant the planner
# tries): each file is parsed once per version of it, and every caller gets its own copy.
def read_json(path: Path) -> Any:
    stat = path.stat()
    return copy.deepcopy(_parsed(str(path), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _parsed(path: str, mtime_ns: int, size: int) -> Any:
    return folders.read_json(Path(path))  # the loader door's reader: bounded in size and depth


def _reference(file: str) -> dict:
    return copy.deepcopy(_reference_parsed(file))


@functools.cache
def _reference_parsed(file: str) -> dict:
    """A reference config shipped as package data (it does not change while the process runs)."""
    return json.loads(resources.files(REFERENCE).joinpath(file).read_text())


def code_files(facts: ModelFacts) -> list[str] | None:
    """The Python files that come with a model (what trust_remote_code imports on every rank): *.py in its
    local folder or newest cached snapshot, and the modules its config.json's auto_map names (`repo--module`
    for code in another repository). None when the model is not on this machine."""
    if facts.where not in ("local", "cache") or facts.path is None:
        return None
    folder = Path(facts.path)
    if not folder.is_dir():
        return None
    files = sorted(p.name for p in folder.glob("*.py"))
    auto_map = (facts.config or {}).get("auto_map") or {}
    if not isinstance(auto_map, dict):
        auto_map = {}
    for ref in auto_map.values():
        for target in ref if isinstance(ref, list) else [ref]:
            if isinstance(target, str) and "." in target:
                module = target.rpartition(".")[0].replace("--", ": ") + ".py"
                if module not in files:
                    files.append(module)
    return files


def for_model(name: str | None) -> ModelSource | None:
    """The model's classes and submodules (see for_config)."""
    return for_config(model_config(name))


def for_config(config: dict | None) -> ModelSource | None:
    """The classes and submodules of the model a config.json describes; a composite model's (a vision-language
    model: its own modeling file, and those of its text and vision sub-configs' types, as LLaVA builds a Llama and
    a CLIP inside) together."""
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


def local_folder(name: str) -> Path | None:
    """The folder `name` loads from on this machine (the model door, sources/model.py: a local folder, or its
    snapshot in the Hub cache); None when it is neither."""
    facts = model_facts(name)
    return Path(facts.path) if facts.where in ("local", "cache") and Path(facts.path or "").is_dir() else None
