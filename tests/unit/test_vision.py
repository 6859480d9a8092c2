"""Vision-language models on the launcher side (no torch): the kind read from config.json, the family's row turned
into the rank spec (FSDP units for both towers, LoRA on the language model, the trainer keeping the images), the
three spellings of image data converted and checked, and every refusal before launch with its file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fsdp_tune.cli.app import app
from fsdp_tune.config.model_kinds import CAUSAL_LM, FAMILIES, VISION_LANGUAGE, family_of, kind_of
from fsdp_tune.sources.convert import to_trl
from fsdp_tune.sources.formats import detect_format
from fsdp_tune.sources.rowcheck import check_row
from tests.conftest import FIXTURES, checked_spec
from tests.image_data import image_row, text_row, write_images, write_mixed

VISION = FIXTURES / "vision"
BASE = str(FIXTURES / "tiny_lora.yaml")
QWEN, LLAVA = str(VISION / "qwen2_vl"), str(VISION / "llava")
VLM = ["--chat_template_format", "none"]  # the processor's template (FT127)
runner = CliRunner()


def _spec(*flags: str):
    return checked_spec(*flags, config=BASE)


def _config(folder: str) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def test_the_kind_is_read_from_config_json() -> None:
    assert kind_of(_config(QWEN)) == VISION_LANGUAGE and family_of(_config(QWEN)).title == "Qwen2-VL"
    assert kind_of(_config(LLAVA)) == VISION_LANGUAGE and family_of(_config(LLAVA)).model_type == "llava"
    assert kind_of({"model_type": "llama"}) == CAUSAL_LM and family_of({"model_type": "llama"}) is None
    assert kind_of(None) == CAUSAL_LM


@pytest.mark.parametrize(
    "folder,units",
    [
        (QWEN, ["Qwen2VLDecoderLayer", "Qwen2VLVisionBlock", "PatchMerger"]),
        (LLAVA, ["LlamaDecoderLayer", "CLIPEncoderLayer", "LlavaMultiModalProjector"]),  # from the sub-configs
    ],
)
def test_both_towers_and_the_projector_are_fsdp_units(folder: str, units: list[str]) -> None:
    spec, _ = _spec("--model_name_or_path", folder, *VLM)
    assert spec.model.kind == VISION_LANGUAGE and spec.model.vision.guard == "dummy_image"
    assert spec.fsdp_config.transformer_layer_cls_to_wrap == units
    assert spec.trainer_args.remove_unused_columns is False  # each row's images reach the collator


def _excluded(spec, name: str) -> bool:
    return re.fullmatch(spec.lora.exclude_modules, name) is not None


def test_lora_trains_the_language_model_by_default() -> None:
    spec, _ = _spec("--model_name_or_path", QWEN, *VLM, "--lora_target_modules", "q_proj")
    assert spec.lora.target_modules == ["q_proj"] and spec.lora.modules_to_save is None
    for frozen in ("model.visual", "model.visual.blocks.0.attn.qkv", "model.visual.merger.mlp.0"):
        assert _excluded(spec, frozen), frozen
    assert not _excluded(spec, "model.language_model.layers.0.self_attn.q_proj")
    llava, _ = _spec("--model_name_or_path", LLAVA, *VLM, "--lora_target_modules", "q_proj")
    # CLIP's attention has a q_proj too: excluded with its tower
    assert _excluded(llava, "model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj")
    assert not _excluded(llava, "model.language_model.layers.1.self_attn.q_proj")


def test_the_tower_and_the_projector_train_when_asked() -> None:
    flags = ["--model_name_or_path", QWEN, *VLM, "--lora_target_modules", "q_proj", "v_proj"]
    spec, _ = _spec(*flags, "--freeze_vision_tower", "false", "--freeze_multi_modal_projector", "false")
    assert spec.model.vision.train_tower and spec.model.vision.train_projector
    assert set(FAMILIES["qwen2_vl"].tower_linears) <= set(spec.lora.target_modules)  # LoRA on the tower too
    assert not _excluded(spec, "model.visual.blocks.0.attn.qkv")
    assert _excluded(spec, "model.visual.merger.mlp.0")  # trained whole, not adapted
    assert spec.lora.modules_to_save == ["model.visual.merger"]


def test_config_refusals() -> None:
    from fsdp_tune.validate import check

    unknown = check(BASE, ["--model_name_or_path", str(VISION / "unknown"), *VLM])
    assert [f.rule for f in unknown.errors] == ["FT125"] and "idefics3" in unknown.errors[0].message
    template = check(BASE, ["--model_name_or_path", QWEN, "--chat_template_format", "chatml"])
    assert "FT127" in [f.rule for f in template.errors]
    dpo = check(BASE, ["--model_name_or_path", QWEN, *VLM, "--method", "dpo"])
    assert "FT126" in [f.rule for f in dpo.errors]
    text = check(BASE, ["--freeze_vision_tower", "false"])  # builtin:tiny-llama has no vision tower
    assert [f.rule for f in text.findings if f.severity.value == "warning"] == ["FT128"]


@pytest.mark.parametrize("spelling", ["messages", "sharegpt", "inline"])
def test_the_three_spellings_of_image_data(spelling: str) -> None:
    row = image_row(0, "img/0.png", spelling)
    fmt = detect_format(row.keys(), [row])
    converted = to_trl(row, fmt)
    assert converted["images"] == ["img/0.png"], converted
    assert converted["messages"][0]["content"] == [{"type": "image"}, {"type": "text", "text": "What color is this?"}]
    assert check_row(row, fmt) == []
    text = text_row(spelling) | ({"images": []} if spelling != "inline" else {})
    assert "images" not in to_trl(text, fmt) or to_trl(text, fmt)["images"] == []


def _train(tmp_path: Path, data: Path, *flags: str, model: str = QWEN):
    out = tmp_path / "out"
    args = ["train", "--config", BASE, "--output_dir", str(out), "--dataset_name", str(data), "--model_name_or_path"]
    result = runner.invoke(app, [*args, model, *(VLM if model != "builtin:tiny-llama" else []), *flags])
    assert not out.exists() or not any(out.iterdir()), "refused runs leave nothing behind"
    return result


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bad_images_are_refused_before_launch_with_file_and_line(tmp_path) -> None:
    names = write_images(tmp_path, 3)
    (tmp_path / "img" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    rows = [image_row(0, names[0]), image_row(1, "img/missing.png"), text_row() | {"images": []}]
    rows.append(image_row(2, "img/broken.png"))
    data = _write(tmp_path / "train.jsonl", rows)
    r = _train(tmp_path, data)
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "PF078" in out and f"{data}:2" in out and "the image file does not exist" in out
    assert f"{data}:4" in out and "the image cannot be read" in out and "broken.png" in out


def test_a_placeholder_count_that_does_not_match_is_refused(tmp_path) -> None:
    names = write_images(tmp_path, 2)
    two = {"conversations": [{"from": "human", "value": "<image><image>Both?"}, {"from": "gpt", "value": "Yes."}]}
    rows = [image_row(0, names[0], "sharegpt"), two | {"images": [names[1]]}]
    r = _train(tmp_path, _write(tmp_path / "train.jsonl", rows))
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "PF079" in out and "2 image placeholder(s) for 1 image(s)" in out, r.output
    assert f"{tmp_path / 'train.jsonl'}:2" in out
    assert "PF017" not in out  # refused once, not also reported as a skipped row


def test_an_image_for_a_text_only_model_is_refused(tmp_path) -> None:
    r = _train(tmp_path, write_mixed(tmp_path / "data", n=4), model="builtin:tiny-llama")
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "PF082" in out and "reads no images" in out, r.output


@pytest.mark.parametrize(
    "flags,refused",
    [
        (["--packing", "true"], "packing"),
        (["--padding_free", "true"], "padding_free"),
        (["--truncation_mode", "keep_end"], "truncation_mode"),
    ],
)
def test_what_trl_refuses_for_vision_data_is_refused_before_launch(tmp_path, flags, refused) -> None:
    r = _train(tmp_path, write_mixed(tmp_path / "data", n=4), *flags)
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "PF081" in out and f"--{refused}" in out and "(TRL)" in out, r.output


def test_the_plan_says_what_trains_and_what_the_images_are(tmp_path) -> None:
    from fsdp_tune.launch.torchrun import command
    from fsdp_tune.launch.train import plan_run
    from fsdp_tune.output.run import describe_launch

    data = write_mixed(tmp_path / "data", n=6)
    args = ["--output_dir", str(tmp_path / "o"), "--dataset_name", str(data), "--model_name_or_path", QWEN, *VLM]
    planned = plan_run(BASE, args, print)
    assert not [f for f in planned.machine_findings if f.severity.value == "error"], planned.machine_findings
    text = describe_launch(planned.config, planned.spec, command(planned.spec), planned.counted)
    assert "vision: Qwen2-VL, vision-language model; vision tower (model.visual) frozen" in text
    assert "every rank runs the vision tower each step" in text
    assert f"images: {data} [train]: 3 rows with images, 3 text-only; largest 64x48" in text


def test_an_image_for_a_language_models_chat_is_refused(tmp_path) -> None:
    from fsdp_tune.errors import UsageError
    from fsdp_tune.tools.chat import Chat, image_for

    text_run = Chat(model=None, tokenizer=None, device="cpu", described="", processor=None)
    with pytest.raises(UsageError, match="reads no images"):
        image_for(text_run, str(tmp_path / "a.png"))
    assert image_for(text_run, None) is None


def test_a_gpu_runs_decisions_for_a_vision_model(tmp_path) -> None:
    """On 8 H100s in bf16 (decided, not run): both towers and the projector are units under one bf16 policy, and
    what trains is upcast to fp32 as accelerate does, so every unit's trainable tensors share one dtype."""
    import shutil
    import struct

    from fsdp_tune.decide.machine import Machine

    model = tmp_path / "qwen2_vl"
    shutil.copytree(QWEN, model)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)  # sharded loading
    gpus = Machine(cuda=True, gpus=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8)
    flags = ["--model_name_or_path", str(model), *VLM, "--use_cpu", "false", "--num_processes", "8", "--bf16", "true"]
    spec, _ = checked_spec(*flags, config=BASE, machine=gpus)
    assert spec.device == "cuda" and spec.backend == "nccl" and spec.model.dtype == "bfloat16"
    units = ["Qwen2VLDecoderLayer", "Qwen2VLVisionBlock", "PatchMerger"]
    assert spec.unit_fsdp_config.transformer_layer_cls_to_wrap == units
    assert spec.model.vision.guard == "dummy_image"  # the same guard: NCCL would wait 30 minutes without it
    plan = spec.loading.sharded
    assert spec.loading.path == "sharded" and list(plan.layer_cls) == units
    assert plan.mp_policy.kwargs() == {
        "param_dtype": "bfloat16",
        "reduce_dtype": "bfloat16",
        "output_dtype": "bfloat16",
    }
    assert plan.upcast_trainable
