"""Read a config file of any of the four formats into assignments (canonical path, raw value, origin).

Formats are told apart by content, not by file extension: an Accelerate YAML has `distributed_type`
or `fsdp_config`; a recipe has fsdp-tune's sections; TRL's `--config` YAML (`trl sft --config sft.yaml`) is one
flat mapping of the script's argument names (`model_name_or_path`, `dataset_name`, `use_peft`, `lora_r`, any
SFTConfig field), read as `train`'s flags are; a Transformers `fsdp_config` (JSON, or YAML) has FSDP keys at the top
level. Values stay raw here; `normalize.py` coerces and checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdp_tune.config import keys, limits
from fsdp_tune.config.envvars import expand
from fsdp_tune.config.fsdp2 import ACCELERATE_DEFAULT
from fsdp_tune.config.names import flag_table, other_name, section_keys, trl_file_names
from fsdp_tune.config.parse import line_map, parse
from fsdp_tune.config.schema import SECTIONS, Assignment, Origin
from fsdp_tune.config.suggest import did_you_mean
from fsdp_tune.errors import Finding, Severity, UsageError

ACCELERATE = "accelerate"
TRANSFORMERS = "transformers"
RECIPE = "recipe"
TRL = "trl"
MANIFEST = "manifest"


@dataclass
class FileConfig:
    format: str
    assignments: list[Assignment]
    findings: list[Finding]


def detect_format(data: dict[str, Any]) -> str | None:
    if "fsdp_tune_manifest" in data:
        return MANIFEST
    if "distributed_type" in data or "compute_environment" in data:
        return ACCELERATE
    # TRL's mixture list and the training method may sit at the top
    sections = {k: v for k, v in data.items() if k not in keys.RECIPE_TOP_KEYS}
    if set(data) & {*keys.RECIPE_SECTIONS, *keys.RECIPE_TOP_KEYS} and all(
        isinstance(v, dict) or v is None for v in sections.values()
    ):
        return RECIPE
    if set(data) & trl_file_names():  # before `fsdp_config`: SFTConfig has that field too
        return TRL
    if "fsdp_config" in data:
        return ACCELERATE
    stripped = {k.removeprefix("fsdp_") for k in data}
    if stripped & set(keys.FSDP_KEYS):
        return TRANSFORMERS
    return None


def read_file(path_str: str) -> FileConfig:
    path = Path(path_str)
    if not path.is_file():
        raise UsageError(
            f"config file {path_str} does not exist" if not path.exists() else f"{path_str} is not a file",
            "pass an Accelerate YAML, a Transformers fsdp_config JSON or an fsdp-tune recipe",
        )
    limits.check_size(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path_str} is not UTF-8 text", "save the config as UTF-8") from None
    data = parse(path, text)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UsageError(f"{path_str}: the top level must be a mapping of keys, got {type(data).__name__}")
    fmt = detect_format(data) if data else RECIPE
    if fmt is None:
        raise UsageError(
            f"{path_str}: cannot tell which kind of config this is (keys: {', '.join(list(data)[:6])})",
            "an Accelerate YAML has `distributed_type`, a Transformers fsdp_config has FSDP keys such as "
            "`reshard_after_forward`, a recipe has sections such as `fsdp:` and `training:`, TRL's config file "
            "has its script's arguments such as `model_name_or_path` and `dataset_name`",
        )
    reader = _Reader(path_str, line_map(text))
    if fmt != MANIFEST:  # a manifest records expanded values: read as written
        data, reader.findings = expand(data, lambda key: reader.origin(key).source, literal=fmt != RECIPE)
    if fmt == ACCELERATE:
        reader.accelerate(data)
    elif fmt == TRANSFORMERS:
        reader.fsdp_section(data, (), default_version=2)
    elif fmt == MANIFEST:
        reader.recipe(data.get("resolved_config", {}))
    elif fmt == TRL:
        reader.trl_file(data)
    else:
        reader.recipe(data)
    return FileConfig(fmt, reader.assignments, reader.findings)


def read_fsdp_mapping(data: dict[str, Any], source: str) -> FileConfig:
    """A Transformers fsdp_config given inline (`--fsdp_config '{"version": 2, ...}'`): FSDP keys at the top."""
    reader = _Reader(source, {})
    reader.fsdp_section(data, (), default_version=2)
    return FileConfig(TRANSFORMERS, reader.assignments, reader.findings)


class _Reader:
    def __init__(self, filename: str, lines: dict[tuple[str, ...], int]):
        self.filename = filename
        self.lines = lines
        self.assignments: list[Assignment] = []
        self.findings: list[Finding] = []

    def origin(self, path: tuple[str, ...]) -> Origin:
        line = self.lines.get(path)
        return Origin(".".join(path), f"{self.filename}:{line}" if line else self.filename)

    def set(self, canonical: str, value: Any, path: tuple[str, ...]) -> None:
        if value is None:
            return  # `key: null` is how accelerate config writes "not set": the default stands
        self.assignments.append(Assignment(canonical, value, self.origin(path)))

    def is_mapping(self, data: Any, path: tuple[str, ...], message: str) -> bool:
        """True for a mapping; otherwise records FT003 at `path`."""
        if isinstance(data, dict):
            return True
        self.findings.append(Finding("FT003", Severity.ERROR, ".".join(path), self.origin(path).source, message))
        return False

    def unknown(self, path: tuple[str, ...], known: list[str], what: str) -> None:
        key = path[-1]
        self.findings.append(
            Finding(
                "FT001",
                Severity.ERROR,
                ".".join(path),
                self.origin(path).source,
                f"unknown {what} key `{key}`",
                did_you_mean(key, known) or f"known keys: {', '.join(sorted(known)[:12])}, ...",
            )
        )

    def accelerate(self, data: dict[str, Any]) -> None:
        if "distributed_type" not in data:
            self.findings.append(
                Finding(
                    "FT002",
                    Severity.ERROR,
                    "distributed_type",
                    self.filename,
                    "an Accelerate config needs `distributed_type` (accelerate refuses the file without it)",
                    "add `distributed_type: FSDP`",
                )
            )
        for key, value in data.items():
            path = (key,)
            if key == "fsdp_config":
                self.fsdp_section(value if value is not None else {}, path, default_version=1)
            elif key == "parallelism_config":
                self.parallelism_section(value or {}, path)
            elif key == "dynamo_config":
                self.dynamo_section(value or {}, path)
            elif key in keys.ACCELERATE_TOP:
                canonical = keys.ACCELERATE_TOP[key]
                if canonical:
                    self.set(canonical, value, path)
            else:
                known = [*keys.ACCELERATE_TOP, "fsdp_config", "parallelism_config", "dynamo_config"]
                self.unknown(path, known, "Accelerate")
        if "fsdp_config" not in data:
            # accelerate's launcher and plugin default to FSDP1 when nothing says otherwise
            self.fsdp_section({}, ("fsdp_config",), default_version=1)

    def dynamo_section(self, data: Any, prefix: tuple[str, ...]) -> None:
        """accelerate's torch.compile settings; passed to the ranks as accelerate launch does (env)."""
        if not self.is_mapping(data, prefix, "must be a mapping of dynamo_ keys"):
            return
        for key, value in data.items():
            name = key.removeprefix("dynamo_")
            if name in keys.DYNAMO_KEYS:
                self.set(f"launch.dynamo_{name}", value, (*prefix, key))
            else:
                self.unknown((*prefix, key), [f"dynamo_{k}" for k in keys.DYNAMO_KEYS], "dynamo_config")

    def fsdp_section(self, data: Any, prefix: tuple[str, ...], default_version: int) -> None:
        if not self.is_mapping(data, prefix or ("fsdp_config",), "must be a mapping of FSDP keys"):
            return
        has_version = False
        for key, value in data.items():
            path = (*prefix, key)
            name = key.removeprefix("fsdp_")
            if name not in keys.FSDP_KEYS:
                self.unknown(path, list(keys.FSDP_KEYS), "FSDP")
                continue
            canonical = keys.FSDP_KEYS[name]
            has_version |= canonical == "fsdp.version"
            if canonical:
                self.set(canonical, value, path)
        if not has_version:
            # accelerate launch reads no version as FSDP1 (config/fsdp2.py runs it as FSDP2 and says so)
            what = ACCELERATE_DEFAULT if default_version == 1 else "absent, transformers' default"
            origin = Origin("fsdp_version", f"{self.filename}: {what}")
            self.assignments.insert(0, Assignment("fsdp.version", default_version, origin))

    def parallelism_section(self, data: Any, prefix: tuple[str, ...]) -> None:
        if not self.is_mapping(data, prefix, "must be a mapping of parallelism_config_* keys"):
            return
        if data:
            # accelerate: a non-empty parallelism_config turns the feature on
            self.set("parallelism.enabled", True, prefix)
        for key, value in data.items():
            path = (*prefix, key)
            name = key.removeprefix(keys.PARALLELISM_PREFIX)
            if name == key and name in keys.PARALLELISM_KEYS:
                self.findings.append(
                    Finding(
                        "FT004",
                        Severity.ERROR,
                        ".".join(path),
                        self.origin(path).source,
                        f"`{key}` lacks the `parallelism_config_` prefix: accelerate silently ignores it and runs "
                        "with every size at 1",
                        f"rename it to `{keys.PARALLELISM_PREFIX}{key}`",
                    )
                )
            elif name in keys.PARALLELISM_KEYS:
                self.set(f"parallelism.{name}", value, path)
            else:
                self.unknown(path, [keys.PARALLELISM_PREFIX + k for k in keys.PARALLELISM_KEYS], "parallelism_config")

    def recipe(self, data: dict[str, Any]) -> None:
        for section, body in data.items():
            if section in keys.RECIPE_TOP_KEYS:  # TRL's `datasets:` mixture, the training method (`method: dpo`)
                self.set(keys.RECIPE_TOP_KEYS[section], body, (section,))
                continue
            if section not in keys.RECIPE_SECTIONS:
                self.unknown((section,), [*keys.RECIPE_SECTIONS, *keys.RECIPE_TOP_KEYS], "recipe section")
                continue
            body = body or {}
            if not self.is_mapping(body, (section,), "a recipe section must be a mapping"):
                continue
            if section == "fsdp":
                self.fsdp_section(body, (section,), default_version=2)
                continue
            if section == "training":
                # `training:` takes anything `train` takes as a flag, so a whole run fits in one file
                for key, value in body.items():
                    self.flag_key((section, key), value, "`training`")
                continue
            known = section_keys(section)
            for key, value in body.items():
                path = (section, key)
                if key in known:
                    self.set(known[key], value, path)
                else:
                    self.unknown(path, list(known), f"`{section}`")

    def flag_key(self, path: tuple[str, ...], value: Any, what: str) -> None:
        """A key named as `train`'s flag is (a recipe's `training:`, TRL's config file)."""
        key, table = path[-1], flag_table()
        if key in table:
            self.set(table[key], value, path)
        elif (read := other_name(key, value, self.origin(path))) is not None:
            assignment, finding = read
            self.findings.append(finding)
            if assignment is not None:
                self.assignments.append(assignment)
        else:
            self.unknown(path, list(table), what)

    def trl_file(self, data: dict[str, Any]) -> None:
        """TRL's `--config` YAML: what TrlParser sets as the script's argument defaults, read as `train`'s flags
        (TRL's names are flags: names.flag_table); its `env:` mapping is refused (FT017)."""
        for key, value in data.items():
            if key == keys.TRL_ENV_KEY:
                if not value:
                    continue  # `env: {}` sets nothing
                names = ", ".join(map(str, value)) if isinstance(value, dict) else "not a mapping"  # no values: tokens
                self.findings.append(
                    Finding(
                        "FT017",
                        Severity.ERROR,
                        key,
                        self.origin((key,)).source,
                        f"`env:` ({names}): TRL sets these in its own process; fsdp-tune does not change its "
                        "environment from a config file",
                        "drop `env:` and set the variables in the shell or the job file (export NAME=value)",
                    )
                )
                continue
            if key in keys.RECIPE_SECTIONS and isinstance(value, dict):
                self.findings.append(
                    Finding(
                        "FT001",
                        Severity.ERROR,
                        key,
                        self.origin((key,)).source,
                        f"a recipe section `{key}:` beside flat keys: the file is read as TRL's config file (one flat "
                        "mapping) because of its top-level keys",
                        f"move the top-level keys into `training:` (a recipe), or `{key}:`'s keys to the top level",
                    )
                )
                continue
            self.flag_key((key,), value, "TRL config")


assert set(SECTIONS) | {"training"} == set(keys.RECIPE_SECTIONS)
