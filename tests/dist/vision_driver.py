"""Test-only driver: one torchrun launch (2 CPU ranks) trains each tiny vision-language model in turn, in one process
group, through fsdp-tune's worker recipe for each rank spec the test decided (tests/dist/test_vision.py); then, last,
the same mix without the guard, which must fail (a collective mismatch or the process group's timeout).

Run as `torchrun --nproc_per_node 2 tests/dist/vision_driver.py PLAN.json`. Rank 0 writes OUTPUT_DIR/vision_result.json
per run (the unguarded run: vision_started.json before its first step, and nothing after). A failing run ends the
job, with its traceback in the result file, so no rank waits in a collective.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.dist.arch_driver import run_plan  # noqa: E402

QUESTION = "What color is this?"


def probe_image():
    from PIL import Image

    return Image.new("RGB", (64, 48), (200, 120, 40))


def train_one(spec, entry: dict) -> dict:
    """The recipe's steps for one rank spec, with the model's processor; what the test checks afterwards."""
    from fsdp_tune.worker.loading.processor import load_processing
    from fsdp_tune.worker.recipe import Handoff, Recipe
    from fsdp_tune.worker.wrappers import describe_units, outer

    os.environ.update(spec.env)
    started = time.time()
    recipe = Recipe(Handoff(spec, None), started)
    tokenizer, processor = load_processing(spec.model)
    args = recipe.seeded_config()
    with args.main_process_first(desc="dataset preparation"):
        data = recipe.prepare_data(tokenizer, processor)
    loaded = recipe.load_model(tokenizer, args)
    trainer = recipe.build_trainer(loaded, tokenizer, data, processor).trainer
    if entry.get("unguarded"):
        Path(spec.output_dir, "vision_started.json").write_text(json.dumps({"name": entry["name"]}))
    recipe.train(trainer)
    saved = recipe.save(trainer, loaded, tokenizer, processor)
    return {
        "name": entry["name"],
        "loading": loaded.path,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "adapter_check": saved["adapter_check"],
        "units": describe_units(outer(trainer)),
        "dummies": _gathered(trainer.data_collator.dummies),
        "logits": image_logits(trainer, processor),
        "seconds": round(time.time() - started, 1),
    }


def _gathered(value) -> list:
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def image_logits(trainer, processor) -> list:
    """The trained model's logits on an image prompt, under FSDP (a collective: every rank runs the same batch);
    the adapter reloaded outside FSDP must give the same."""
    import torch

    from fsdp_tune.tools.vision import image_prompt
    from fsdp_tune.worker.wrappers import outer

    model = outer(trainer)
    model.eval()
    with torch.no_grad():
        logits = model(**image_prompt(processor, QUESTION, probe_image(), "cpu")).logits
    model.train()
    return logits[0].float().tolist()


def unguarded(spec, entry: dict):
    """The guard off, when the entry asks: each rank runs the vision tower only for its own images."""
    if not entry.get("unguarded"):
        return spec
    vision = dataclasses.replace(spec.model.vision, guard="none")
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, vision=vision))


if __name__ == "__main__":
    run_plan(sys.argv[1], "vision", train_one, unguarded)
