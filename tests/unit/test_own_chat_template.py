"""The README's pattern `train --config configs/demo_cpu.yaml --model_name_or_path MINE` (#48): the demo file's
`chat_template_format: chatml` was written for the demo's model; a model given on the command line that has its own
chat template keeps it (no ChatML tokens added, no grown vocabulary), and a note (FT018) says so with the flag that
replaces it. A template asked for on the command line, or in the file that names the model, applies."""

from __future__ import annotations

import json

from fsdp_tune.decide.machine import Machine
from fsdp_tune.decide.rank import decide
from fsdp_tune.validate import check
from tests.conftest import REPO

DEMO = str(REPO / "configs" / "demo_cpu.yaml")
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2}


def _model(folder, template: dict | None, file: str = "tokenizer_config.json"):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    if template is not None:
        (folder / file).write_text(json.dumps(template) if file.endswith(".json") else template["chat_template"])
    return str(folder)


def _run(*flags: str, config: str = DEMO):
    checked = check(config, list(flags))
    assert not checked.errors, checked.findings
    notes = [f for f in checked.findings if f.rule == "FT018"]
    return decide(checked.config, Machine.cpu_only()).model.chat_template, notes


OWN = {"chat_template": "{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"}


def test_a_model_with_its_own_template_keeps_it_and_the_note_says_so(tmp_path) -> None:
    mine = _model(tmp_path / "mine", OWN)
    template, (note,) = _run("--model_name_or_path", mine)
    assert template is None  # the ranks keep the tokenizer's template: nothing added to the vocabulary
    assert note.severity.value == "note" and note.source.startswith(f"{DEMO}:")
    assert f"{mine} (--model_name_or_path, command line) has its own chat template" in note.message
    assert "tokenizer_config.json chat_template" in note.message and "keeps it" in note.message
    assert note.hint.startswith("--chat_template_format chatml replaces it")


def test_transformers_5s_template_file_counts_too(tmp_path) -> None:
    mine = _model(tmp_path / "mine", OWN, file="chat_template.jinja")
    template, (note,) = _run("--model_name_or_path", mine)
    assert template is None and "(chat_template.jinja)" in note.message


def test_the_command_line_still_replaces_it(tmp_path) -> None:
    mine = _model(tmp_path / "mine", OWN)
    assert _run("--model_name_or_path", mine, "--chat_template_format", "chatml") == ("chatml", [])


def test_a_model_without_a_template_takes_the_files_and_is_told(tmp_path) -> None:
    mine = _model(tmp_path / "mine", None)
    template, (note,) = _run("--model_name_or_path", mine)
    assert template == "chatml" and "has no chat template of its own" in note.message


def test_the_file_that_names_the_model_decides_its_template(tmp_path) -> None:
    mine = _model(tmp_path / "mine", OWN)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model:\n  model_name_or_path: {mine}\ndata:\n  chat_template_format: chatml\n")
    assert _run(config=str(recipe)) == ("chatml", [])
    assert _run(config=DEMO) == ("chatml", [])  # the demo's own builtin model: as the demo was written


def test_a_model_in_the_hub_cache_is_looked_up_there(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _model(tmp_path / "hf" / "hub" / "models--acme--chat-7b" / "snapshots" / "abc123", OWN, "chat_template.jinja")
    template, (note,) = _run("--model_name_or_path", "acme/chat-7b")
    assert template is None and "acme/chat-7b" in note.message


def test_a_model_not_on_this_machine_takes_the_files_and_says_why(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    template, (note,) = _run("--model_name_or_path", "acme/elsewhere")
    assert template == "chatml" and "cannot be read here" in note.message
    assert note.hint == "--chat_template_format none keeps the model's own template"


def test_a_vision_model_from_the_command_line_keeps_its_processors_template() -> None:
    """The README's vision example starts from the demo config: no FT127 refusal, the processor's template."""
    vlm = str(REPO / "tests" / "fixtures" / "vision" / "qwen2_vl")
    checked = check(DEMO, ["--model_name_or_path", vlm])
    assert not [f for f in checked.findings if f.rule == "FT127"] and checked.config.data.chat_template_format == "none"
