"""Test-only driver: one torchrun launch (2 CPU ranks) trains every architecture family in turn, in one process
group, by executing fsdp-tune's worker recipe for each rank spec the test decided (tests/dist/test_architectures.py).

Run as `torchrun --nproc_per_node 2 tests/dist/arch_driver.py PLAN.json`. For each run: tokenizer, data,
model (the spec's attention, dtype, 4-bit), LoraConfig, FsdpTuneTrainer, the steps, the final gather, save and
verify, exactly as worker/recipe.py does them; then accelerate's global state is reset for the next family.
Rank 0 writes OUTPUT_DIR/arch_result.json per run. A failing run ends the job (torchrun stops the other rank),
with its traceback in the result file, so no rank waits in a collective.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path


def setup(spec, log_dir: str) -> int:
    from fsdp_tune.worker import cpu_fsdp, recipe
    from fsdp_tune.worker.logs import setup_rank_log
    from fsdp_tune.worker.saving import hub

    os.environ.update(spec.env)
    rank = int(os.environ.get("RANK", "0"))
    setup_rank_log(log_dir, rank)
    cpu_fsdp.install()
    hub.exclude_bookkeeping()
    recipe.init_process_group(spec)
    return rank


def train_one(spec, entry: dict) -> dict:
    """The recipe's steps for one rank spec; what the test checks afterwards."""
    from fsdp_tune.worker import recipe
    from fsdp_tune.worker.loading.sharded import prebuilt
    from fsdp_tune.worker.wrappers import describe_units

    os.environ.update(spec.env)
    started = time.time()
    tokenizer = recipe.build_tokenizer(spec)
    args = recipe.training_args(spec)
    with args.main_process_first(desc="dataset preparation"):
        train_ds, eval_ds, _ = recipe.build_data(spec, tokenizer)
    model, args = recipe.build_model(spec, tokenizer, args)
    attention = model.config._attn_implementation
    loading = "sharded" if prebuilt(model) else "transformers"
    trainer, _ = recipe.build_trainer(spec, args, model, tokenizer, train_ds, eval_ds)
    recipe.train(trainer, spec)
    saved = recipe.save_and_verify(trainer, spec, tokenizer)
    result = {
        "name": entry["name"],
        "attention": attention,
        "loading": loading,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "adapter_check": saved["adapter_check"],
        "units": describe_units(trainer.model_wrapped or trainer.model),
        "trainable": _trainable(trainer),
        "seconds": round(time.time() - started, 1),
    }
    if entry.get("reload_into_fsdp"):  # before any forward outside training leaves the root unit unsharded
        result["reloaded_into_fsdp"] = reload_into_fsdp(trainer, spec)
    result["logits"] = sharded_logits(trainer)
    del trainer, model
    return result


PROMPT = [3, 17, 42, 99, 120, 7, 250, 11]  # token ids every family's tokenizer has


def sharded_logits(trainer) -> list:
    """The trained model's logits on a fixed prompt, computed under FSDP (a collective): the adapter reloaded
    outside FSDP must give the same."""
    import torch

    model = trainer.model_wrapped or trainer.model
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT])).logits
    model.train()
    return logits[0].float().tolist()


def _trainable(trainer) -> int:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def reload_into_fsdp(trainer, spec) -> bool:
    """Resume's path: the saved adapter loaded back into the sharded model (load_adapter_into_fsdp) after its
    trainable tensors are zeroed must give back exactly what was saved."""
    import torch
    from safetensors.torch import load_file

    from fsdp_tune.worker.saving.save import gather_trainable, peft_keys

    peft_model = trainer.accelerator.unwrap_model(trainer.model)
    keys = peft_keys(peft_model)
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.zero_()
    from fsdp_tune.worker.saving.save import load_adapter_into_fsdp

    assert load_adapter_into_fsdp(trainer, spec.output_dir)
    back = gather_trainable(trainer.model_wrapped or trainer.model, also=frozenset(keys))
    saved = load_file(str(Path(spec.output_dir) / "adapter_model.safetensors"))
    return all(torch.equal(back[name], saved[key]) for name, key in keys.items())


def reset() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    gc.collect()


def main(plan_path: str) -> None:
    from fsdp_tune.worker.recipe import read_spec

    plan = json.loads(Path(plan_path).read_text())
    rank = None
    for entry in plan["runs"]:
        spec = read_spec(entry["resolved"])
        if rank is None:
            rank = setup(spec, plan["log_dir"])
        out = Path(spec.output_dir) / "arch_result.json"
        print(f"arch_driver: {entry['name']}", flush=True)
        try:
            result = train_one(spec, entry)
        except BaseException:
            if rank == 0:
                out.write_text(json.dumps({"name": entry["name"], "error": traceback.format_exc()}))
            print(traceback.format_exc(), file=sys.stderr, flush=True)
            os._exit(1)
        if rank == 0:
            out.write_text(json.dumps(result))
        reset()


if __name__ == "__main__":
    main(sys.argv[1])
