"""Vision-language LoRA under FSDP2 on 2 CPU ranks, in one torchrun launch (tests/dist/vision_driver.py): a tiny
random Qwen2-VL, Qwen2.5-VL, Qwen3-VL and LLaVA, each on data whose even rows hold an image and odd rows are text
only, read in order, so one rank's batches have images while the other's have none, every step. Each run finishes (no
hang, within the launch's bounded timeout) with its loss falling, its adapter reloads outside FSDP and changes the
logits on an image prompt (as the sharded model gave them), and the processor is in the run folder and in the merged
model. Last in the launch, the same mix with the guard off fails: the collectives of the vision tower's units pair up
wrongly.

Each rank spec is decided by fsdp-tune's own validate + decide + data pre-flight, as `train` decides it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.dist.conftest import launch_driver
from tests.image_data import write_mixed
from tests.vision_models import build_vlms

BASE = FIXTURES / "tiny_lora.yaml"
TIMEOUT = int(os.environ.get("FSDP_TUNE_TEST_TIMEOUT", "600"))
PG_TIMEOUT_S = 60  # the unguarded run's collectives give up after this (gloo); the launch stays bounded
# one row a rank a step, read in order: rank 0 reads the image rows, rank 1 the text-only ones
FLAGS = ["--per_device_train_batch_size", "1", "--train_sampling_strategy", "sequential", "--max_steps", "8"]
FLAGS += ["--learning_rate", "0.01", "--chat_template_format", "none", "--ddp_timeout", str(PG_TIMEOUT_S)]


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    spelling: str = "messages"  # sources/vision.py: content blocks, <image> placeholders, or blocks with their image
    unguarded: bool = False


CASES = [
    Case("qwen2_vl", "qwen2_vl"),
    Case("qwen2_5_vl", "qwen2_5_vl", spelling="inline"),  # each image block carries its image
    Case("qwen3_vl", "qwen3_vl"),
    Case("llava", "llava", spelling="sharegpt"),
    Case("qwen2_vl-unguarded", "qwen2_vl", unguarded=True),  # last: it ends the launch
]
GUARDED = [c for c in CASES if not c.unguarded]


def _decide(case: Case, model_dir: Path, data: Path, out: Path) -> Path:
    from fsdp_tune.decide.data import read_files
    from fsdp_tune.decide.machine import Machine
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.preflight.checks import check_data
    from fsdp_tune.validate import check

    flags = ["--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir", str(out), *FLAGS]
    checked = check(str(BASE), flags)
    assert not checked.errors, [str(f) for f in checked.findings]
    files = read_files(checked.config)  # as `train` plans it: the spec decided from the data files read once
    spec = decide(checked.config, Machine(cuda=False, gpus=0), files=files)
    counted, problems = check_data(spec, files)
    assert not [p for p in problems if p.severity.value == "error"], problems
    assert counted[0].images["image_rows"] == 12
    out.mkdir(parents=True)
    resolved = out / "vision_spec.json"
    resolved.write_text(json.dumps({"spec": spec.as_dict()}))
    return resolved


@pytest.fixture(scope="module")
def launched(model_cache, tmp_path_factory) -> dict:
    """Every case in one torchrun launch: name -> (result or None, model dir, output dir), and the launch."""
    models = build_vlms(model_cache)
    root = tmp_path_factory.mktemp("vision")
    runs, where = [], {}
    for case in CASES:
        data = write_mixed(root / f"data-{case.name}", n=24, spelling=case.spelling)
        out = root / case.name
        resolved = _decide(case, models[case.family], data, out)
        runs.append({"name": case.name, "resolved": str(resolved), "unguarded": case.unguarded})
        where[case.name] = (models[case.family], out)
    launch = launch_driver("vision", root, runs, {name: out for name, (_, out) in where.items()}, model_cache, TIMEOUT)
    results, proc, logs = launch.results, launch.proc, launch.logs
    guarded = {c.name for c in GUARDED}
    failed = {n: r["error"][-3000:] for n, r in results.items() if r and "error" in r and n in guarded}
    done = all(results[c.name] and "error" not in results[c.name] for c in GUARDED)
    assert done and not failed, f"{failed or ''}\n{proc.stderr[-4000:]}\n{logs}"
    return {"runs": {n: (results[n], *where[n]) for n in where}, "proc": proc, "logs": logs}


@pytest.mark.parametrize("case", GUARDED, ids=[c.name for c in GUARDED])
def test_mixed_batches_train_and_the_adapter_reloads(launched, case: Case) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    from fsdp_tune.models.processor import load_processor
    from fsdp_tune.tools.vision import image_prompt
    from tests.dist.vision_driver import QUESTION, probe_image

    result, model_dir, out = launched["runs"][case.name]
    assert result["loading"] == "sharded", result["loading"]  # through transformers' own key renames
    assert result["dummies"][0] == 0 and result["dummies"][1] >= 8, result["dummies"]  # rank 1: text only, guarded
    losses = result["losses"]
    assert len(losses) == 8 and losses[-1] < losses[0], losses
    assert result["adapter_check"]["ok"]
    units = result["units"]
    assert sum(units.values()) > 1 and any("Vision" in k or "Encoder" in k for k in units), units  # both towers
    processor = load_processor(str(out))  # the processor beside the adapter
    assert (out / "preprocessor_config.json").exists() and (out / "processor_config.json").exists()
    inputs = image_prompt(processor, QUESTION, probe_image(), "cpu")
    base = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = base(**inputs).logits[0]
        reloaded = PeftModel.from_pretrained(base, str(out)).eval()(**inputs).logits[0]
    sharded = torch.tensor(result["logits"])
    assert (reloaded - plain).abs().max() > 1e-3, "the adapter changes nothing on an image prompt"
    assert torch.allclose(reloaded, sharded, atol=1e-4, rtol=1e-4), (reloaded - sharded).abs().max()


def test_the_merged_model_carries_the_processor(launched, tmp_path) -> None:
    from fsdp_tune.models.processor import load_processor
    from fsdp_tune.tools.merge import merge

    _, model_dir, out = launched["runs"]["qwen2_vl"]
    merged = tmp_path / "merged"
    result = merge(str(out), str(model_dir), str(merged), "fp32", "1GB", "cpu", force=False)
    assert result["max_rel_logit_diff"] <= result["tolerance"]  # checked on an image prompt (tools/merge.py)
    assert (merged / "preprocessor_config.json").exists() and (merged / "chat_template.jinja").exists()
    assert type(load_processor(str(merged))).__name__ == "Qwen2VLProcessor"


def test_without_the_guard_the_same_mix_fails(launched) -> None:
    """The check that the mix above would deadlock: the unguarded run started training and never finished; its
    ranks' collectives paired up wrongly (gloo: a size mismatch, or the process group's timeout)."""
    result, _, out = launched["runs"]["qwen2_vl-unguarded"]
    proc = launched["proc"]
    assert (out / "vision_started.json").exists(), launched["logs"]
    assert result is None or "error" in result, result
    assert proc.returncode != 0
    said = proc.stderr + proc.stdout + launched["logs"] + (result or {}).get("error", "")
    signs = ("collective mismatch", "doesn't match expected size", "Connection reset", "Timed out", "timeout")
    assert any(s in said for s in signs), said[-4000:]


def test_chat_answers_about_an_image(launched, tmp_path) -> None:
    """`chat RUN --image FILE`'s pieces: the run's processor and adapter, a prompt with the image, an answer."""
    from fsdp_tune.tools.chat import answer, image_for, load
    from tests.dist.vision_driver import probe_image

    _, _, out = launched["runs"]["llava"]
    picture = tmp_path / "probe.png"
    probe_image().save(picture)
    chat = load(str(out), device="cpu")
    assert chat.processor is not None and "reads images" in chat.described
    reply = answer(
        chat, [{"role": "user", "content": "What color?"}], 4, 0.0, stream=False, image=image_for(chat, str(picture))
    )
    assert isinstance(reply, str)
