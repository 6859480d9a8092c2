"""The loader door: every model, tokenizer, processor and adapter folder that `chat`, `merge`, a reward model and
the ranks open goes through here (the rules are config/folders.py's, torch-free; these are the calls).

- `trust_remote_code` is always passed, from the one setting (the run's `model.trust_remote_code`, off unless the
  user turned it on); transformers asks "run the custom code? [y/N]" on stdin only when it gets None, and its prompt
  is switched off besides (TIME_OUT_REMOTE_CODE 0: its own CI setting, read when it would ask), so no folder can
  read the user's stdin.
- A folder that needs its own code without the opt-in is refused naming the file that asks for it; with the opt-in
  a warning names the .py files that will run.
- A model_type transformers does not know is one short line, not its list of every type.
- An adapter is bounded (rank, scale, regex targets, its weights' header) before PEFT reads it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fsdp_tune.config.folders import FolderRefused, check_adapter, code_configs
from fsdp_tune.sources.model import CONFIG, local_folder, model_facts
from fsdp_tune.sources.modelcheck import code_asked

WARNED: set[str] = set()


def no_prompt() -> None:
    """transformers' remote-code prompt cannot be reached: with TIME_OUT_REMOTE_CODE 0 it raises instead of
    reading stdin (dynamic_module_utils.resolve_trust_remote_code)."""
    from transformers import dynamic_module_utils

    dynamic_module_utils.TIME_OUT_REMOTE_CODE = 0


def prepared(name: str, trust_remote_code: bool, what: str = "the model") -> None:
    """Before any transformers call on `name`: the prompt off, and its code refused or announced (see the module's
    docstring); a model_type transformers does not know refused in one line."""
    no_prompt()
    folder = local_folder(name)
    if folder is None:
        return
    facts = model_facts(name)
    if facts.problem:  # a config.json that is there and cannot be read: the loader's answer, not transformers'
        raise FolderRefused(f"{facts.config_file}: {facts.problem}", "restore the config.json the model came with")
    asking = list(code_configs(folder, facts.config, CONFIG)) if trust_remote_code else code_asked(folder, facts)
    if asking and not trust_remote_code:
        raise FolderRefused(
            f"{folder / asking[0]}: {what} needs its own Python code (auto_map), which runs only when you allow it",
            "read the folder's .py files, then pass --trust_remote_code to run them (or use a model "
            "transformers supports natively)",
        )
    if asking and str(folder) not in WARNED:
        WARNED.add(str(folder))
        files = ", ".join(sorted(p.name for p in folder.glob("*.py"))) or f"the modules {asking[0]}'s auto_map names"
        print(f"warning: trust_remote_code: {what}'s own code runs from {folder}: {files}", file=sys.stderr)
    _known_type(facts)


def _known_type(facts) -> None:
    """config.json's model_type one transformers knows, or code of the folder's (auto_map); else one line naming
    the file (transformers' own error lists every type it knows: 9 KB). `facts`: the model door's."""
    from fsdp_tune.sources.modelcheck import known_model_types

    path, config = facts.config_file, facts.config
    known = known_model_types()
    if path is None or config is None or not known:  # no config (a tokenizer's folder), or transformers' not read
        return
    if not isinstance(config, dict):
        raise FolderRefused(f"{path}: not a JSON object", "a model's config.json")
    model_type = config.get("model_type")
    if model_type in known or config.get("auto_map"):
        return
    raise FolderRefused(
        f"{path}: model_type {str(model_type)[:60]!r} is not one the installed transformers knows",
        "pip install -U transformers (a newer model), or check config.json's model_type",
    )


def _refusal(name: str, err: ValueError) -> FolderRefused | None:
    """transformers' own refusal of code it was not allowed to run, as ours (exit 2)."""
    text = str(err)
    if "trust_remote_code" in text or "custom code" in text:
        return FolderRefused(
            f"{name}: needs its own Python code, which runs only when you allow it",
            "read its .py files, then pass --trust_remote_code",
        )
    return None


def _called(name: str, call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except ValueError as err:
        refused = _refusal(name, err)
        if refused is None:
            raise
        raise refused from None


def open_tokenizer(name: str, trust_remote_code: bool, **kwargs):
    from transformers import AutoTokenizer

    prepared(name, trust_remote_code, "the tokenizer")
    return _called(name, AutoTokenizer.from_pretrained, name, trust_remote_code=trust_remote_code, **kwargs)


def open_config(name: str, trust_remote_code: bool, **kwargs):
    from transformers import AutoConfig

    prepared(name, trust_remote_code)
    return _called(name, AutoConfig.from_pretrained, name, trust_remote_code=trust_remote_code, **kwargs)


def open_model(auto, name: str, trust_remote_code: bool, **kwargs):
    """`auto.from_pretrained(name, ...)` (an Auto class) through the door."""
    prepared(name, trust_remote_code)
    return _called(name, auto.from_pretrained, name, trust_remote_code=trust_remote_code, **kwargs)


def open_processor(name: str, trust_remote_code: bool, revision: str | None = None):
    from fsdp_tune.models.processor import load_processor

    prepared(name, trust_remote_code, "the processor")
    return _called(name, load_processor, name, trust_remote_code, revision)


def open_adapter(model, folder: str | Path, **kwargs):
    """PeftModel.from_pretrained, after the adapter's config and weights header are checked (config/folders.py)."""
    from peft import PeftModel

    check_adapter(Path(folder))
    return PeftModel.from_pretrained(model, str(folder), **kwargs)
