"""The batch of a vision-language run, built on every rank from the rows rank 0 prepared (sources/vision_rows.py):
the images opened and processed by the model's image processor, each image's placeholder token expanded into the
tokens the processor gives it (checked against the count the data was prepared with), right-padded as TRL pads, the
images never in the loss.

No hang by construction. Under FSDP2 the vision tower's blocks are units of their own: a rank whose batch has
images all-gathers them, a rank whose batch has none would skip them, and the ranks' collectives then pair up
wrongly (gloo: "Received data size doesn't match expected size"; NCCL: a wait until the timeout, 30 minutes by
default). So a batch without images gets one tiny image (guard "dummy_image"): its tokens are placed after the
last real token of the shortest row, where no real token attends to them (causal attention) and none is in the
loss (labels -100), so the loss, the gradients and every real token's logits are what the batch gives without it,
while every rank runs the tower's forward (and backward, when it trains) every step, whatever the mix of image
and text rows across ranks. It costs one image's forward on text-only batches; modality-aligned batches across
ranks would cost a global sampler and still break under gradient accumulation's uneven tails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fsdp_tune.sources.vision_rows import expansion, opened

DUMMY_SIZE = (28, 28)  # pixels: each family's processor resizes it to its smallest image
IGNORE = -100


@dataclass
class VisionCollator:
    processor: Any
    pad_token_id: int
    pad_to_multiple_of: int | None = None
    guard: str = "dummy_image"
    dummies: int = field(default=0, init=False)  # batches that got the guard's image (the summary says how many)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        images = [opened(im) for ex in examples for im in ex.get("images") or []]
        counts = [c for ex in examples for c in ex.get("image_tokens") or []]
        rows = [(list(ex["input_ids"]), _labels(ex)) for ex in examples]
        dummy = not images and self.guard == "dummy_image"
        if dummy:
            from PIL import Image

            images = [Image.new("RGB", DUMMY_SIZE)]
            self.dummies += 1
        if not images:
            return self._pad(rows, {})
        expanded, processed = expansion(self.processor, images)
        if not dummy:
            _check(expanded, counts)
            rows = _spliced(rows, expanded, int(self.processor.image_token_id))
        else:
            shortest = min(range(len(rows)), key=lambda i: len(rows[i][0]))
            ids, labels = rows[shortest]
            rows[shortest] = (ids + expanded[0], labels + [IGNORE] * len(expanded[0]))
        unused = set(getattr(self.processor, "unused_input_names", None) or ())
        return self._pad(rows, {k: v for k, v in processed.items() if k not in unused})

    def _pad(self, rows: list[tuple[list[int], list[int]]], pixels: dict) -> dict[str, torch.Tensor]:
        longest = max(len(ids) for ids, _ in rows)
        if self.pad_to_multiple_of:
            longest = -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of
        batch = {
            "input_ids": torch.tensor([ids + [self.pad_token_id] * (longest - len(ids)) for ids, _ in rows]),
            "attention_mask": torch.tensor([[1] * len(ids) + [0] * (longest - len(ids)) for ids, _ in rows]),
            "labels": torch.tensor([labels + [IGNORE] * (longest - len(labels)) for _, labels in rows]),
        }
        if wants_mm_token_type_ids(self.processor):
            types = self.processor.create_mm_token_type_ids(batch["input_ids"].tolist())
            batch["mm_token_type_ids"] = torch.tensor(types)
        return {**batch, **pixels}


def wants_mm_token_type_ids(processor) -> bool:
    """Whether the model places image tokens by `mm_token_type_ids` (Qwen2-VL's and Qwen2.5-VL's M-RoPE: their
    `get_rope_index` gives each image token its temporal/height/width position from them), decided here once, by
    what the installed processor says, whatever transformers' version:
    - transformers 5.24 (and 5.25): a class attribute, `Qwen2VLProcessor.return_mm_token_type_ids = True`;
    - transformers 5.17: no such attribute; a default text kwarg of the processor's kwargs class
      (`Qwen2VLProcessorKwargs._defaults["text_kwargs"]["return_mm_token_type_ids"]`).
    Without them 5.17's Qwen2-VL raises in forward, and Qwen2.5-VL (5.17 and 5.24 alike) silently gives the image
    tokens text positions (`compute_3d_position_ids` returns None). tests/lib/test_vision_pieces.py
    (test_image_tokens_get_mrope_positions) checks the positions the language model receives are M-RoPE's."""
    flag = getattr(processor, "return_mm_token_type_ids", None)
    if flag is None:
        kwargs = getattr(getattr(processor, "valid_processor_kwargs", None), "_defaults", None) or {}
        flag = (kwargs.get("text_kwargs") or {}).get("return_mm_token_type_ids", False)
    return bool(flag)


def _labels(example: dict[str, Any]) -> list[int]:
    """The row's labels: its answer tokens' ids, -100 elsewhere. TRL leaves a dataset with images to the collator
    unprepared (SFTTrainer._skip_prepare_dataset), so the mask rank 0 made is applied here, as TRL applies it."""
    if "labels" in example:
        return list(example["labels"])
    return [t if m else IGNORE for t, m in zip(example["input_ids"], example["assistant_masks"], strict=True)]


def _check(expanded: list[list[int]], counts: list[int]) -> None:
    """The processor gives each image the tokens the data was prepared for (else the sequence lengths rank 0 cut
    at max_seq_len, and the model's own check, would be off)."""
    got = [len(e) for e in expanded]
    if got != counts:
        raise RuntimeError(
            f"the processor expands this batch's images into {got} tokens, the data was prepared for {counts}: "
            "the processor changed since the data was prepared (delete OUTPUT_DIR/fsdp_tune_data to prepare it again)"
        )


def _spliced(rows: list[tuple[list[int], list[int]]], expanded: list[list[int]], token: int):
    """Each image placeholder (in order across the batch) replaced by its image's tokens, labelled -100."""
    images = iter(expanded)
    out = []
    for ids, labels in rows:
        new_ids, new_labels = [], []
        for t, label in zip(ids, labels, strict=True):
            if t == token:
                tokens = next(images)
                new_ids += tokens
                new_labels += [IGNORE] * len(tokens)
            else:
                new_ids.append(t)
                new_labels.append(label)
        out.append((new_ids, new_labels))
    return out


def dummy_batches(collator) -> list[int] | None:
    """Each rank's batches that got the guard's image (a collective: every rank calls it), for the summary; None
    for a run without the vision collator."""
    if not isinstance(collator, VisionCollator):
        return None
    import torch.distributed as dist

    counts = [collator.dummies]
    if dist.is_available() and dist.is_initialized():
        counts = [None] * dist.get_world_size()
        dist.all_gather_object(counts, collator.dummies)
    return counts


def collator_for(spec, data, processor, tokenizer) -> VisionCollator | None:
    """The vision collator when the prepared rows carry images (None: TRL's own, for text; data without any image
    trains as text on every rank alike, since every rank reads the same prepared data)."""
    if processor is None or "images" not in data.train.column_names:
        return None
    vision = spec.model.vision
    return VisionCollator(
        processor,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        pad_to_multiple_of=spec.data.pad_to_multiple_of,
        guard=vision.guard if vision is not None else "dummy_image",
    )
