"""The rule registry: each rule a pure function RunConfig -> findings, registered with a stable id, and the
helpers rules use to cite a key as the user wrote it.

A rule that depends on what is decided for the machine (a CPU run, offload that acts) takes the decisions too
(`@rule(..., decided=True)`: fn(cfg, Derived)): validate-config runs it on the config as written, and `train` runs it
again on the machine it launches on (rules/catalog.py machine_findings), so one check has one id at both times."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.errors import Finding, Severity

RuleFn = Callable[..., Iterable[Finding]]  # (cfg) or, for a rule on the decisions, (cfg, Derived)


@dataclass(frozen=True)
class Rule:
    id: str
    family: str
    title: str
    fn: RuleFn
    decided: bool = False  # fn(cfg, Derived): it reads what is decided for the machine (decide/derived.py)


REGISTRY: dict[str, Rule] = {}

# Findings raised while reading and normalizing (not by a registered function), listed for `rules`.
READER_RULES = {
    "FT001": ("config", "unknown key or flag (with the closest known name)"),
    "FT002": ("config", "an Accelerate YAML without distributed_type"),
    "FT003": ("config", "a section that is not a mapping"),
    "FT004": ("config", "a parallelism_config key without its parallelism_config_ prefix"),
    "FT005": ("config", "a malformed command line (a flag without its value, a stray argument)"),
    "FT006": ("config", "a config file too large, too deeply nested, or whose aliases expand too far"),
    "FT010": ("config", "a value of the wrong type or outside its allowed values"),
    "FT011": ("config", "an FSDP1 strategy name where FSDP2 needs reshard_after_forward true/false"),
    "FT012": ("config", "a TrainingArguments name transformers 5 retired (read under its new name, or ignored)"),
    "FT013": ("config", "--fsdp option strings and --fsdp_config files (the Transformers idiom), read as settings"),
    "FT014": ("config", "two spellings of one setting (--use_peft, --use_peft_lora) given different values"),
    "FT015": ("config", "LoRA turned on by TRL's --use_peft: TRL's defaults for the LoRA settings left unset (a note)"),
    "FT017": (
        "config",
        "a name only TRL's scripts read: `env:` of TRL's config file refused, ignore_bias_buffers dropped",
    ),
    "FT018": (
        "config",
        "a model named apart from the config file keeps its own chat template over the file's (a note)",
    ),
    "FT121": ("method", "--adapter: a starting adapter that cannot be read, or settings that contradict its shape"),
}


def rule(rule_id: str, family: str, title: str, decided: bool = False) -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        if rule_id in REGISTRY or rule_id in READER_RULES:
            raise RuntimeError(f"duplicate rule id {rule_id}")
        REGISTRY[rule_id] = Rule(rule_id, family, title, fn, decided)
        return fn

    return register


def finding(cfg: RunConfig, rule_id: str, severity: Severity, path: str, message: str, hint: str = "") -> Finding:
    """A finding about `path`, citing the key as the user wrote it and where it came from."""
    origin = cfg.origin(path)
    key = origin.key if origin else path.split(".", 1)[1]
    source = origin.source if origin else "default"
    return Finding(rule_id, severity, key, source, message, hint)


def error(cfg: RunConfig, rule_id: str, path: str, message: str, hint: str = "") -> Finding:
    return finding(cfg, rule_id, Severity.ERROR, path, message, hint)


def warning(cfg: RunConfig, rule_id: str, path: str, message: str, hint: str = "") -> Finding:
    return finding(cfg, rule_id, Severity.WARNING, path, message, hint)
