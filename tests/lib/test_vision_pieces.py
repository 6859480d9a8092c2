"""Vision-language pieces in one process: the processor without torchvision, what the collator builds against the
processor's own call (the same tokens, pixels and M-RoPE types), the guard's dummy image changing no real token's
logits nor the loss, rank 0's cut at max_seq_len where the image tokens are counted, and a family added as its row
alone (Qwen3-VL, config/model_kinds.py) decided and trained a step with LoRA as the spec says."""

from __future__ import annotations

import json

import pytest
import torch

from tests.image_data import write_images
from tests.vision_models import build_vlms


@pytest.fixture(scope="module")
def vlms(model_cache):
    return build_vlms(model_cache)


def _processor(vlms, family):
    from fsdp_tune.models.processor import load_processor

    return load_processor(str(vlms[family]))


def test_the_processor_loads_and_saves_without_torchvision(vlms, tmp_path) -> None:
    from fsdp_tune.models.processor import load_processor, save_processor

    processor = _processor(vlms, "qwen2_vl")
    assert type(processor).__name__ == "Qwen2VLProcessor" and not hasattr(processor, "video_processor")
    save_processor(processor, tmp_path)
    assert json.loads((tmp_path / "processor_config.json").read_text())["processor_class"] == "Qwen2VLProcessor"
    assert json.loads((tmp_path / "preprocessor_config.json").read_text())["merge_size"] == 2
    again = load_processor(str(tmp_path))
    assert again.image_processor.to_dict() == processor.image_processor.to_dict()


def _example(processor, i: int, image: bool, root) -> dict:
    """A prepared row as rank 0 leaves it: the rendered ids with one placeholder per image, the answer mask."""
    from fsdp_tune.sources.masking import encode_messages
    from fsdp_tune.sources.vision_rows import ImageTokens

    question = [{"type": "image"}, {"type": "text", "text": "What color?"}] if image else "Say hello."
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": f"It is colour {i}."}]
    (enc,) = encode_messages(processor.tokenizer, messages)
    images = [{"bytes": None, "path": str(root / f"img/{i}.png")}] if image else []
    counts = [ImageTokens(processor).count(im) for im in images]
    return {"input_ids": enc.input_ids, "assistant_masks": enc.mask, "images": images, "image_tokens": counts}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava"])
def test_the_collator_builds_what_the_processor_builds(vlms, tmp_path, family: str) -> None:
    from PIL import Image

    from fsdp_tune.worker.data.vision_collate import VisionCollator

    write_images(tmp_path, 2)
    processor = _processor(vlms, family)
    tok = processor.tokenizer
    collate = VisionCollator(processor, pad_token_id=tok.pad_token_id)
    batch = collate([_example(processor, 0, True, tmp_path), _example(processor, 1, False, tmp_path)])
    assert collate.dummies == 0
    text = tok.decode(_example(processor, 0, True, tmp_path)["input_ids"])
    image = Image.open(tmp_path / "img/0.png").convert("RGB")
    theirs = processor(text=[text], images=[image], return_tensors="pt", add_special_tokens=False)
    n = theirs["input_ids"].shape[1]
    assert batch["input_ids"][0, :n].tolist() == theirs["input_ids"][0].tolist()
    assert torch.equal(batch["pixel_values"], theirs["pixel_values"])
    if "mm_token_type_ids" in theirs:  # Qwen2-VL: M-RoPE places the image by them
        assert batch["mm_token_type_ids"][0, :n].tolist() == theirs["mm_token_type_ids"][0].tolist()
    image_positions = batch["input_ids"][0] == processor.image_token_id
    assert image_positions.sum() == _example(processor, 0, True, tmp_path)["image_tokens"][0]
    assert (batch["labels"][0][image_positions] == -100).all()  # images are never in the loss
    assert (batch["labels"][0] != -100).sum() > 0


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava"])
def test_the_dummy_image_changes_no_real_token(vlms, tmp_path, family: str) -> None:
    """A text-only batch with the guard's image gives the loss and every real token's logits the batch gives
    without it (its tokens sit past the shortest row's end, none in the loss)."""
    from transformers import AutoModelForImageTextToText

    from fsdp_tune.worker.data.vision_collate import VisionCollator

    processor = _processor(vlms, family)
    model = AutoModelForImageTextToText.from_pretrained(str(vlms[family]), dtype=torch.float32).eval()
    rows = [_example(processor, 3, False, tmp_path), _example(processor, 12345, False, tmp_path)]
    pad = processor.tokenizer.pad_token_id
    guarded = VisionCollator(processor, pad_token_id=pad)(rows)
    plain = VisionCollator(processor, pad_token_id=pad, guard="none")(rows)
    assert "pixel_values" in guarded and "pixel_values" not in plain
    with torch.no_grad():
        a, b = model(**guarded), model(**plain)
    assert torch.allclose(a.loss, b.loss, atol=1e-6), (a.loss, b.loss)
    real = plain["attention_mask"].bool()
    width = plain["input_ids"].shape[1]
    assert torch.allclose(a.logits[:, :width][real], b.logits[real], atol=1e-5)


def test_rank0_cuts_where_the_image_tokens_are_counted() -> None:
    from fsdp_tune.sources.masking import Encoded
    from fsdp_tune.sources.vision_rows import fit

    image = [{"bytes": None, "path": "x.png"}]
    # 10 tokens, the image placeholder (id 9) at position 2 and 16 image tokens once expanded: 25 tokens
    ids = [1, 2, 9, 3, 4, 5, 6, 7, 8, 0]

    def seq():
        return Encoded(list(ids), [0] * 5 + [1] * 5)

    kept = seq()
    assert fit(kept, image, [16], 9, 30) == "" and not kept.truncated
    cut = seq()
    assert fit(cut, image, [16], 9, 22) == "" and cut.input_ids == ids[:7] and cut.truncated  # text after it cut
    assert fit(seq(), image, [16], 9, 17) == "image-cut"  # max_seq_len would cut into the image's tokens
    assert fit(seq(), [], [], 9, 30) == "image-count"


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava"])
def test_plan_counts_the_tower_and_an_images_tokens(vlms, family: str) -> None:
    """The planner's tower count is the model's; its image tokens for a size are the processor's own count."""
    from transformers import AutoModelForImageTextToText

    from fsdp_tune.config.model_kinds import FAMILIES
    from fsdp_tune.planner.plan import memory_plan
    from fsdp_tune.planner.shape import measure
    from fsdp_tune.validate import check
    from tests.conftest import FIXTURES

    folder = str(vlms[family])
    model = AutoModelForImageTextToText.from_pretrained(folder)
    row = measure(folder)
    family_row = FAMILIES[family]
    parts = (model.get_submodule(family_row.tower), model.get_submodule(family_row.projector))
    tower = {id(p): p.numel() for part in parts for p in part.parameters()}  # Qwen2-VL's projector is in its tower
    assert row.vision_params == sum(tower.values()) and row.vision_layers == 2
    assert row.n_layers == 2 and row.layer_class in (
        "Qwen2VLDecoderLayer",
        "Qwen2_5_VLDecoderLayer",
        "Qwen3VLTextDecoderLayer",
        "LlamaDecoderLayer",
    )
    cfg = check(str(FIXTURES / "tiny_lora.yaml"), ["--model_name_or_path", folder, "--chat_template_format", "none"])
    processor = _processor(vlms, family)
    for size in ((448, 448), (64, 48), (30, 80), (1000, 200)):
        plan = memory_plan(cfg.config, on_cpu=True, image_size=size)
        want = processor._get_num_multimodal_tokens(image_sizes=[(size[1], size[0])]).num_image_tokens[0]
        assert plan["vision"]["tokens_per_image"] == want, (size, plan["vision"])


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_image_tokens_get_mrope_positions(vlms, tmp_path, family: str) -> None:
    """The positions the language model receives for a collated batch are M-RoPE's: an image's tokens share one
    temporal position and spread over its height x width grid, and the text after it resumes past the grid's
    largest position. Without `mm_token_type_ids` in the batch transformers 5.17's Qwen2.5-VL passes None (every
    token a plain text position) and its Qwen2-VL raises (worker/data/vision_collate.py wants_mm_token_type_ids)."""
    from transformers import AutoModelForImageTextToText

    from fsdp_tune.worker.data.vision_collate import VisionCollator

    write_images(tmp_path, 2)
    processor = _processor(vlms, family)
    model = AutoModelForImageTextToText.from_pretrained(str(vlms[family]), dtype=torch.float32).eval()
    batch = VisionCollator(processor, pad_token_id=processor.tokenizer.pad_token_id)(
        [_example(processor, 1, True, tmp_path), _example(processor, 2, False, tmp_path)]
    )
    seen = {}

    def record(module, args, kwargs):
        seen["position_ids"] = kwargs.get("position_ids")

    hook = model.model.language_model.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        model(**batch)
    hook.remove()
    positions = seen["position_ids"]
    assert positions is not None, "the language model got no positions: text positions for the image tokens"
    t, h, w = positions[-3:, 0]  # (temporal, height, width) of row 0 (a leading text row when packed)
    image = (batch["input_ids"][0] == processor.image_token_id).nonzero().flatten()
    grid = batch["image_grid_thw"][0].tolist()
    assert len(image) == grid[1] * grid[2] // 4 > 1  # merged 2x2: several tokens, so a grid to place
    assert len(set(t[image].tolist())) == 1, t[image]  # one frame
    assert len(set(h[image].tolist())) == grid[1] // 2 and len(set(w[image].tolist())) == grid[2] // 2
    after = int(image[-1]) + 1
    assert t[after] == h[after] == w[after] == int(max(t[image].max(), h[image].max(), w[image].max())) + 1
    assert t[after] < after  # behind the plain text position: the image's tokens take fewer positions than ids


@pytest.mark.parametrize("train_tower", [False, True], ids=["tower-frozen", "tower-trains"])
def test_a_family_added_as_its_row_trains_as_decided(vlms, tmp_path, train_tower: bool) -> None:
    """Qwen3-VL is a row of config/model_kinds.py FAMILIES and nothing else: the rank spec `train` decides for it
    makes its row's classes the FSDP units (each one the model has), scopes LoRA to the language model (the tower
    too with --freeze_vision_tower false: its row's linear layers, the DeepStack mergers in the tower's path, never
    the projector), and a collated batch with an image goes forward and backward through the adapted model, the
    gradients reaching exactly what the spec trains."""
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from fsdp_tune.config.model_kinds import FAMILIES
    from fsdp_tune.worker.data.vision_collate import VisionCollator
    from fsdp_tune.worker.loading.adapter import lora_config
    from tests.conftest import FIXTURES, checked_spec

    folder, row = str(vlms["qwen3_vl"]), FAMILIES["qwen3_vl"]
    flags = ["--model_name_or_path", folder, "--chat_template_format", "none", "--lora_target_modules", "q_proj"]
    spec, _ = checked_spec(
        *flags, "--freeze_vision_tower", str(not train_tower).lower(), config=str(FIXTURES / "tiny_lora.yaml")
    )
    assert spec.loading.path == "sharded"  # the ranks load it sharded, these classes the FSDP2 units
    units = spec.loading.sharded.layer_cls
    assert units == (row.language_layers, row.tower_layers, row.projector_class)
    assert spec.model.vision.tower == "model.visual" and spec.model.vision.train_tower is train_tower
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    assert set(units) <= {type(m).__name__ for m in model.modules()}
    model = get_peft_model(model, lora_config(spec))
    adapted = {
        n.split(".lora_B.")[0].removeprefix("base_model.model.") for n, _ in model.named_parameters() if ".lora_B." in n
    }
    language = {n for n in adapted if n.startswith("model.language_model.")}
    assert language and all(n.endswith(".q_proj") for n in language), language
    tower = adapted - language
    if not train_tower:
        assert not tower, tower
    else:
        for name in (
            "blocks.0.attn.qkv",
            "blocks.1.attn.proj",
            "blocks.1.mlp.linear_fc2",
            "deepstack_merger_list.0.linear_fc1",
        ):
            assert f"model.visual.{name}" in tower, (name, sorted(tower))
        assert not [n for n in tower if n.startswith("model.visual.merger.")], tower  # the projector: excluded
        linear = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        assert tower <= {n.removeprefix("base_model.model.").removesuffix(".base_layer") for n in linear}, (
            tower
        )  # no Conv3d
    write_images(tmp_path, 2)
    processor = _processor(vlms, "qwen3_vl")
    batch = VisionCollator(processor, pad_token_id=processor.tokenizer.pad_token_id)(
        [_example(processor, 0, True, tmp_path), _example(processor, 1, False, tmp_path)]
    )
    assert "mm_token_type_ids" in batch and batch["image_grid_thw"].shape == (1, 3)
    model.train()
    loss = model(**batch).loss
    loss.backward()
    assert torch.isfinite(loss)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained), sorted(trained)[:5]  # tower and projector frozen
    moved = {
        n.split(".lora_B.")[0].removeprefix("base_model.model.")
        for n, p in model.named_parameters()
        if ".lora_B." in n and p.grad is not None and p.grad.abs().sum() > 0
    }
    assert moved == adapted, sorted(adapted - moved)  # the image reaches the loss through every adapted layer
