"""A model keeps its own chat template unless the user asked for another one for it.

`--chat_template_format chatml` replaces the tokenizer's template and adds ChatML's special tokens the vocabulary
lacks (config/templates.py apply_template, as PEFT's examples do): the embeddings grow, the adapter then carries
resized embeddings, and a later `--method dpo --adapter` start from it is refused (FT121). The README's examples start
from a config file (`--config configs/demo_cpu.yaml --model_name_or_path MINE`) whose `chat_template_format` was
written for that file's model. So a template set in a file applies to the model that file names; when the model comes
from elsewhere (the command line, an `--adapter`'s base), a model with a chat template of its own keeps it, and a note
(FT018) says so with the flag that replaces it. A template given on the command line always applies. A model without
a template takes the file's (chat data needs one), and a model not on this machine too, each with the note saying so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fsdp_tune.config.folders import FolderRefused, read_json
from fsdp_tune.config.schema import Origin, RunConfig
from fsdp_tune.errors import Finding, Severity

RULE = "FT018"
_PATH = "data.chat_template_format"
# where a tokenizer or processor folder keeps its template (transformers 5 writes chat_template.jinja)
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_WITH_KEY = ("tokenizer_config.json", "processor_config.json")


def apply_template_default(cfg: RunConfig) -> tuple[RunConfig, list[Finding]]:
    """The file's chat_template_format for a model named elsewhere: kept off when the model has its own template."""
    template, model = cfg.origin(_PATH), cfg.origin("model.model_name_or_path")
    name = cfg.model.model_name_or_path
    if cfg.data.chat_template_format == "none" or template is None or model is None or not name:
        return cfg, []
    if name.startswith("builtin:"):
        return cfg, []  # built with ChatML (models/tiny.py): the file's template is the one they were made for
    if not _from_file(cfg, template) or _from_file(cfg, model):
        return cfg, []  # asked on the command line, or the file names both the model and its template
    found = own_template(name)
    asked = f"`{template.key}: {cfg.data.chat_template_format}`"
    replace_hint = f"--chat_template_format {cfg.data.chat_template_format} replaces it (its special tokens are added)"
    if found:
        origins = {**cfg.origins, _PATH: Origin(template.key, f"{name}'s own chat template ({found})")}
        message = f"{name} ({model.key}, {model.source}) has its own chat template ({found}) and keeps it: {asked} is "
        new = replace(cfg, data=replace(cfg.data, chat_template_format="none"), origins=origins)
        return new, [_note(template, message + "for the model the file names", replace_hint)]
    if found is None:
        message = f"{asked} applies to {name}: whether it has a chat template of its own cannot be read here"
        return cfg, [_note(template, message, "--chat_template_format none keeps the model's own template")]
    message = f"{asked} applies to {name}, which has no chat template of its own (its vocabulary gains the "
    return cfg, [_note(template, message + "template's special tokens it lacks)", "")]


def own_template(name: str) -> str | None | bool:
    """Where the model's own chat template is (a file name), False when its folder has none, None when its folder is
    not on this machine."""
    folder = _folder(name)
    if folder is None:
        return None
    for file in _TEMPLATE_FILES:
        if (folder / file).is_file():
            return file
    for file in _WITH_KEY:
        try:
            data = read_json(folder / file) if (folder / file).is_file() else None
        except FolderRefused:  # a file the loader door refuses: no template read from it
            continue
        if isinstance(data, dict) and data.get("chat_template"):
            return f"{file} chat_template"
    return False


def _folder(name: str) -> Path | None:
    """The model's folder as the model door finds it (sources/model.py): a local folder, or its snapshot in the
    Hugging Face cache."""
    from fsdp_tune.sources.model import model_facts

    facts = model_facts(name)
    path = Path(facts.path) if facts.where in ("local", "cache") and facts.path else None
    return path if path is not None and path.is_dir() else None


def _from_file(cfg: RunConfig, origin: Origin) -> bool:
    path = cfg.config_path
    return bool(path) and (origin.source == path or origin.source.startswith(f"{path}:"))


def _note(template: Origin, message: str, hint: str) -> Finding:
    return Finding(RULE, Severity.NOTE, template.key, template.source, message, hint)
