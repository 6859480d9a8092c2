"""Every loading command against hostile and broken folders (#46), and a run folder used from another folder (#48).

The loader door (config/folders.py: the rules; worker/loading/door.py: the calls) opens every model, tokenizer,
processor and adapter folder for `chat`, `merge`, `validate-config --adapter`, a reward model and the ranks. Each
case asserts what the user gets: exit 2 with a message naming the file, no file created by the folder's code, no
prompt on stdin, an answer in bounded time. Commands run in this process (typer's runner, stdin a 'y' line) except
one: a real subprocess whose stdin holds 'y', where transformers' own prompt would read it.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.folders import FolderRefused
from tests.conftest import hub_snapshot

pytestmark = pytest.mark.lib

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny Llama folder (the builtin's recipe, built here) under WORK/models/tiny-llama."""
    from fsdp_tune.models.tiny import build

    work = tmp_path_factory.mktemp("work")
    return build("tiny-llama", str(work / "models" / "tiny-llama"))


@pytest.fixture(scope="module")
def adapter(tiny, tmp_path_factory) -> Path:
    """A LoRA adapter on `tiny` with its tokenizer, recording its base as the relative folder it was trained from
    (`models/tiny-llama`, as `--model_name_or_path models/tiny-llama` records it), and no rank spec."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("adapter") / "run"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), LoraConfig(r=4, target_modules=["q_proj"]))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "models/tiny-llama"}))
    return out


def copied(folder: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(folder, to)
    return to


def invoke(*args: str, cwd: Path | None = None):
    """The CLI in this process, stdin a 'y' line (what transformers' remote-code prompt would take as yes)."""
    here = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        started = time.monotonic()
        result = CliRunner().invoke(app, list(args), input="y\n")
        return result, time.monotonic() - started
    finally:
        os.chdir(here)


def said(result) -> str:
    return result.output + (result.stderr if result.stderr_bytes is not None else "")


# ---------------------------------------------------------------- hostile adapters x every command that reads one


def _header(folder: Path, header: bytes, length: int | None = None) -> None:
    (folder / "adapter_model.safetensors").write_bytes(
        struct.pack("<Q", len(header) if length is None else length) + header
    )


def _config(folder: Path, **changes) -> None:
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))


HOSTILE = {
    "header a number": (lambda f: _header(f, b"5"), "adapter_model.safetensors"),
    "header nested deep": (lambda f: _header(f, b"[" * 100_000 + b"]" * 100_000), "adapter_model.safetensors"),
    "header 2^40 long": (lambda f: _header(f, b"{}", 2**40), "adapter_model.safetensors"),
    "shape an int": (
        lambda f: _header(f, b'{"w": {"dtype": "F32", "shape": 4, "data_offsets": [0, 16]}}'),
        "adapter_model.safetensors",
    ),
    "r absurd": (lambda f: _config(f, r=1_000_000_000), "adapter_config.json"),
    "regex catastrophic": (lambda f: _config(f, target_modules="(.*.*)*Q"), "adapter_config.json"),
}
COMMANDS = {
    "chat": lambda run, tmp: ("chat", str(run), "--prompt", "hi"),
    "merge": lambda run, tmp: ("merge", "--adapter", str(run), "-o", str(tmp / "merged")),
    "validate-config --adapter": lambda run, tmp: ("validate-config", "--adapter", str(run), "--method", "dpo"),
}


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_adapter_is_exit_2_naming_the_file(adapter, tiny, tmp_path, case, command) -> None:
    run = copied(adapter, tmp_path / "run")
    _config(run, base_model_name_or_path=str(tiny))
    spoil, file = HOSTILE[case]
    spoil(run)
    result, took = invoke(*COMMANDS[command](run, tmp_path))
    assert result.exit_code == 2, said(result)
    assert str(run / file) in said(result) and "internal error" not in said(result), said(result)
    assert took < 30 and not (tmp_path / "merged").exists()


# ---------------------------------------------------------------- a folder that ships code


def _remote(folder: Path, marker: Path, file: str = "config.json") -> Path:
    """`folder` made to ask for its own code (auto_map in `file`), which would write `marker`."""
    for module in ("configuration_evil", "modeling_evil", "tokenization_evil"):
        (folder / f"{module}.py").write_text(EVIL.format(marker=str(marker)))
    data = json.loads((folder / file).read_text()) if (folder / file).exists() else {}
    if file == "config.json":
        data.update(model_type="evil", auto_map={"AutoConfig": "configuration_evil.EvilConfig"})
    else:
        data.update(
            tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        )
    (folder / file).write_text(json.dumps(data))
    return folder


def test_a_base_that_ships_code_is_refused_without_reading_stdin(adapter, tiny, tmp_path) -> None:
    """chat as a user runs it, in a process of its own whose stdin holds 'y': transformers' prompt would take it."""
    base = _remote(copied(tiny, tmp_path / "base"), tmp_path / "ran")
    run = copied(adapter, tmp_path / "run")
    _config(run, base_model_name_or_path=str(base))
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "fsdp_tune", "chat", str(run), "--prompt", "hi"],
        input="y\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"{base / 'config.json'}: the model needs its own Python code" in done.stderr
    assert "--trust_remote_code" in done.stderr and "[y/N]" not in done.stdout + done.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("command", ["chat", "merge"])
def test_a_run_tokenizer_that_ships_code_is_refused(adapter, tiny, tmp_path, command) -> None:
    run = _remote(copied(adapter, tmp_path / "run"), tmp_path / "ran", "tokenizer_config.json")
    _config(run, base_model_name_or_path=str(tiny))
    result, _ = invoke(*COMMANDS[command](run, tmp_path))
    assert result.exit_code == 2, said(result)
    assert f"{run / 'tokenizer_config.json'}: the " in said(result) and "tokenizer needs its own Python code" in said(
        result
    )
    assert not (tmp_path / "ran").exists() and not (tmp_path / "merged").exists()


def test_a_reward_model_that_ships_code_is_refused_on_the_ranks(tiny, tmp_path) -> None:
    from fsdp_tune.rewards.resolve import RewardSpec
    from fsdp_tune.worker.training.rewards import reward_model

    folder = _remote(copied(tiny, tmp_path / "rm"), tmp_path / "ran", "tokenizer_config.json")
    reward = RewardSpec(name="rm", kind="reward_model", target=str(folder), written="rm")
    spec = type("Spec", (), {"model": type("Model", (), {"trust_remote_code": False})()})()
    with pytest.raises(FolderRefused, match="tokenizer_config.json: the tokenizer needs its own Python code"):
        reward_model(reward, spec)
    assert not (tmp_path / "ran").exists()


def test_a_reward_model_that_ships_code_is_refused_before_launch(tiny, tmp_path) -> None:
    """The same folder, asked of the same rules by the reward pre-flight (PF097): refused before any rank starts;
    with the opt-in, or for a folder without code of its own, nothing is said."""
    from fsdp_tune.preflight.rewards import _code
    from fsdp_tune.rewards.resolve import RewardSpec

    folder = _remote(copied(tiny, tmp_path / "rm"), tmp_path / "ran", "tokenizer_config.json")
    reward = RewardSpec(name="rm", kind="reward_model", target=str(folder), written="rm")

    def spec(trust: bool):
        return type("Spec", (), {"model": type("Model", (), {"trust_remote_code": trust})()})()

    (found,) = _code(reward, spec(False))
    assert found.rule == "PF097" and found.key == "--reward_funcs" and found.source == "rm"
    assert found.message.startswith(f"{folder / 'tokenizer_config.json'}: the reward model needs its own Python code")
    assert "--trust_remote_code true" in found.hint
    assert _code(reward, spec(True)) == []
    plain = RewardSpec(name="rm", kind="reward_model", target=str(copied(tiny, tmp_path / "plain")), written="p")
    assert _code(plain, spec(False)) == []
    assert not (tmp_path / "ran").exists()


def test_transformers_cannot_prompt_even_when_asked_with_none(tiny, tmp_path, monkeypatch) -> None:
    """The belt under the braces: transformers' own prompt (trust_remote_code None) raises instead of reading
    stdin once the door has been used."""
    import io

    from transformers import AutoConfig

    from fsdp_tune.worker.loading.door import no_prompt

    base = _remote(copied(tiny, tmp_path / "base"), tmp_path / "ran")
    stdin = io.StringIO("y\n")
    monkeypatch.setattr(sys, "stdin", stdin)
    no_prompt()
    with pytest.raises(ValueError):
        AutoConfig.from_pretrained(str(base), trust_remote_code=None)
    assert stdin.read() == "y\n" and not (tmp_path / "ran").exists()


def test_with_the_opt_in_a_warning_names_the_files_that_run(tiny, tmp_path, capsys) -> None:
    from fsdp_tune.worker.loading.door import prepared

    base = _remote(copied(tiny, tmp_path / "base"), tmp_path / "ran")
    prepared(str(base), True)
    assert "configuration_evil.py, modeling_evil.py" in capsys.readouterr().err


def test_an_unknown_model_type_is_one_short_line(adapter, tiny, tmp_path) -> None:
    base = copied(tiny, tmp_path / "base")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "model_type": "not-a-model"}))
    run = copied(adapter, tmp_path / "run")
    _config(run, base_model_name_or_path=str(base))
    result, _ = invoke("chat", str(run), "--prompt", "hi")
    assert result.exit_code == 2, said(result)
    assert f"{base / 'config.json'}: model_type 'not-a-model' is not one" in said(result)
    assert len(said(result)) < 600  # transformers' own message lists every type it knows (9 KB)


# ---------------------------------------------------------------- templates


LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
ESCAPE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


@pytest.mark.parametrize(("template", "said_"), [(LOOP, "did not finish rendering in 1 s"), (ESCAPE, "sandbox")])
def test_chat_refuses_a_template_that_loops_or_breaks_the_sandbox(
    adapter, tiny, tmp_path, monkeypatch, template, said_
):
    from fsdp_tune.config import templates

    monkeypatch.setattr(templates, "RENDER_SECONDS", 1.0)
    run = copied(adapter, tmp_path / "run")
    _config(run, base_model_name_or_path=str(tiny))
    (run / "chat_template.jinja").write_text(template)
    result, took = invoke("chat", str(run), "--prompt", "hi", "--max_new_tokens", "2")
    assert result.exit_code == 2, said(result)
    assert f"{run}'s chat template: " in said(result) and said_ in said(result), said(result)
    assert took < 60


def test_train_preflight_refuses_a_template_that_never_ends(tmp_path, monkeypatch) -> None:
    from fsdp_tune.config import templates
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.models.tiny import build_tokenizer
    from fsdp_tune.preflight import tokens as tokencheck
    from tests.conftest import FIXTURES
    from tests.datafiles import jsonl

    monkeypatch.setattr(templates, "RENDER_SECONDS", 1.0)
    tok = build_tokenizer(512)
    tok.chat_template = LOOP
    monkeypatch.setattr(tokencheck, "load_tokenizer", lambda model: (tok, ""))
    rows = [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}] * 3
    data = jsonl(tmp_path / "a.jsonl", rows)
    started = time.monotonic()
    plan = plan_run(
        str(FIXTURES / "tiny_lora.yaml"), ["--output_dir", str(tmp_path / "o"), "--dataset_name", str(data)], print
    )
    assert time.monotonic() - started < 60
    (refusal,) = [f for f in plan.machine_findings if f.rule == "PF070"]
    assert refusal.severity.value == "error", refusal
    assert "the chat template did not finish rendering" in refusal.message
    assert "chat template is at fault" in refusal.hint


# ---------------------------------------------------------------- images


def test_a_decompression_bomb_is_a_bad_image_not_a_crash(tmp_path) -> None:
    """A 20000 x 20000 PNG of a few bytes (PIL refuses to decode it): a finding's reason on the launcher, and a
    skipped row on rank 0 (what it catches includes PIL's error)."""
    from PIL import Image

    from fsdp_tune.preflight.images import open_image
    from fsdp_tune.sources.vision_rows import unreadable_image

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = tmp_path / "bomb.png"
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0)
    png.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")
    )
    size, why = open_image(str(png))
    assert size == (0, 0) and why.startswith("the image is too large to decode safely"), why
    assert Image.DecompressionBombError in unreadable_image()


# ---------------------------------------------------------------- #48: a run folder used from elsewhere


def _record(run: Path, **manifest) -> None:
    (run / "fsdp_tune_run.json").write_text(json.dumps({"fsdp_tune_manifest": 1, **manifest}))


def test_chat_and_merge_find_a_relative_base_from_another_folder(adapter, tiny, tmp_path) -> None:
    """The adapter records `models/tiny-llama`, relative to where it trained; from another folder that name is no
    folder (and would read as a Hub id). The manifest's absolute record finds it; for a run from before that
    record, its working folder."""
    from fsdp_tune.rundir.manifest import base_model

    work = tiny.parent.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    here = os.getcwd()
    os.chdir(work)
    try:
        recorded = base_model("models/tiny-llama")
    finally:
        os.chdir(here)
    assert recorded == {"name": "models/tiny-llama", "path": str(tiny.resolve())}
    run = copied(adapter, tmp_path / "run")
    _record(run, cwd="/nowhere", base_model=recorded)
    result, _ = invoke("chat", str(run), "--prompt", "hi", "--max_new_tokens", "2", cwd=elsewhere)
    assert result.exit_code == 0, said(result)
    assert f"chat: models/tiny-llama [{tiny.resolve()}] (" in said(result)  # the name as given, then where
    older = copied(adapter, tmp_path / "older")
    _record(older, cwd=str(work))  # a manifest from before the absolute record
    result, _ = invoke("merge", "--adapter", str(older), "-o", str(tmp_path / "merged"), cwd=elsewhere)
    assert result.exit_code == 0, said(result)
    assert "merged models/tiny-llama + " in said(result) and (tmp_path / "merged" / "model.safetensors").exists()


def test_a_base_that_is_nowhere_is_answered_at_once(adapter, tmp_path, monkeypatch) -> None:
    """No folder, not in the Hub cache, the Hub not switched off: a clear exit 2 in a moment, not minutes of
    retries and an internal error."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    run = copied(adapter, tmp_path / "run")
    result, took = invoke("chat", str(run), "--prompt", "hi", cwd=tmp_path)
    assert result.exit_code == 2 and took < 10, said(result)
    assert "the base model models/tiny-llama" in said(result) and "--base" in said(result), said(result)
    _config(run, base_model_name_or_path="someorg/not-downloaded")
    result, took = invoke("merge", "--adapter", str(run), "-o", str(tmp_path / "m"), cwd=tmp_path)
    assert result.exit_code == 2 and took < 10, said(result)
    assert "hf download someorg/not-downloaded" in said(result)


def test_a_cached_hub_model_is_read_from_the_cache(tiny, tmp_path, monkeypatch) -> None:
    """A Hub id in the cache (what `hf download` leaves) loads from its snapshot folder: no network."""
    from fsdp_tune.tools.base import locate

    cache = tmp_path / "hub"
    snapshot = copied(tiny, hub_snapshot(cache, "someorg/tiny", "abc123"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert locate("someorg/tiny") == str(snapshot)
    with pytest.raises(FolderRefused) as refused:
        locate("someorg/other")
    assert "not on this machine" in str(refused.value) and "hf download someorg/other" in refused.value.hint


# ---------------------------------------------------------------- chat on a whole model (#48): merged, plain, cached


def test_chat_takes_a_whole_model_folder_through_the_door(tiny, tmp_path, monkeypatch) -> None:
    """`chat FOLDER` on a whole model (config.json, no adapter): loaded in its own dtype with its own chat template,
    answering; a Hub id's snapshot in the cache the same way; code it ships refused without --trust_remote_code; a
    sequence classifier (a merged reward model) refused: it does not generate."""
    from fsdp_tune.tools.chat import load

    result, _ = invoke("chat", str(tiny), "--prompt", "Hi", "--max_new_tokens", "3")
    assert result.exit_code == 0, said(result)
    assert f"chat: {tiny} (a whole model, its own dtype float32), its chat template, on cpu" in said(result)

    cache = tmp_path / "hub"
    snapshot = copied(tiny, hub_snapshot(cache, "someorg/tiny", "abc123"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    chat = load("someorg/tiny", device="cpu")
    assert chat.described.startswith(f"someorg/tiny [{snapshot}] (a whole model")
    assert chat.model.get_input_embeddings().weight.shape[0] >= len(chat.tokenizer)

    code = _remote(copied(tiny, tmp_path / "code"), tmp_path / "ran")
    result, _ = invoke("chat", str(code), "--prompt", "Hi")
    assert result.exit_code == 2 and "the model needs its own Python code" in said(result), said(result)
    assert not (tmp_path / "ran").exists()

    scorer = copied(tiny, tmp_path / "scorer")
    config = json.loads((scorer / "config.json").read_text())
    (scorer / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForSequenceClassification"]}))
    result, _ = invoke("chat", str(scorer), "--prompt", "Hi")
    assert result.exit_code == 2 and "is a sequence classifier (LlamaForSequenceClassification" in said(result)
