"""Test-only driver: one torchrun launch (2 CPU ranks) trains every architecture family in turn, in one process
group, by executing fsdp-tune's worker recipe for each rank spec the test decided (tests/dist/test_architectures.py).

Run as `torchrun --nproc_per_node 2 tests/dist/arch_driver.py PLAN.json`. For each run: tokenizer, data,
model (the spec's attention, dtype, 4-bit), LoraConfig, the method's trainer, the steps, the final gather, save
and verify, through worker/recipe.py's own steps; then accelerate's global state is reset for the next family.
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
    from fsdp_tune.worker import cpu_fsdp, process
    from fsdp_tune.worker.logs import setup_rank_log
    from fsdp_tune.worker.rank import rank
    from fsdp_tune.worker.saving import hub

    os.environ.update(spec.env)
    setup_rank_log(log_dir, rank())
    cpu_fsdp.install()
    hub.exclude_bookkeeping()
    process.init_process_group(spec)
    return rank()


def train_one(spec, entry: dict) -> dict:
    """The recipe's steps for one rank spec; what the test checks afterwards."""
    from fsdp_tune.worker.loading.tokenizer import load_tokenizer
    from fsdp_tune.worker.recipe import Handoff, Recipe
    from fsdp_tune.worker.wrappers import describe_units, outer

    os.environ.update(spec.env)
    started = time.time()
    recipe = Recipe(Handoff(spec, None), started)
    tokenizer = load_tokenizer(spec.model)
    args = recipe.seeded_config()
    with args.main_process_first(desc="dataset preparation"):
        data = recipe.prepare_data(tokenizer)
    loaded = recipe.load_model(tokenizer, args)
    attention = loaded.model.config._attn_implementation
    trainer = recipe.build_trainer(loaded, tokenizer, data).trainer
    recipe.train(trainer)
    saved = recipe.save(trainer, loaded, tokenizer)
    result = {
        "name": entry["name"],
        "attention": attention,
        "loading": loaded.path,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "adapter_check": saved["adapter_check"],
        "units": describe_units(outer(trainer)),
        "trainable": _trainable(trainer),
        "seconds": round(time.time() - started, 1),
    }
    if entry.get("reload_into_fsdp"):  # before any forward outside training leaves the root unit unsharded
        result["reloaded_into_fsdp"] = reload_into_fsdp(trainer, spec)
    result["logits"] = sharded_logits(trainer)
    del trainer, loaded
    return result


PROMPT = [3, 17, 42, 99, 120, 7, 250, 11]  # token ids every family's tokenizer has


def sharded_logits(trainer) -> list:
    """The trained model's logits on a fixed prompt, computed under FSDP (a collective): the adapter reloaded
    outside FSDP must give the same."""
    import torch

    from fsdp_tune.worker.wrappers import outer

    model = outer(trainer)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT])).logits
    model.train()
    return logits[0].float().tolist()


def _trainable(trainer) -> int:
    from fsdp_tune.worker.wrappers import inner

    model = inner(trainer)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def reload_into_fsdp(trainer, spec) -> bool:
    """Resume's path: the saved adapter loaded back into the sharded model (load_adapter_into_fsdp) after its
    trainable tensors are zeroed must give back exactly what was saved."""
    import torch
    from safetensors.torch import load_file

    from fsdp_tune.runfiles import ADAPTER_WEIGHTS
    from fsdp_tune.worker.saving.save import gather_trainable, load_adapter_into_fsdp, peft_keys
    from fsdp_tune.worker.wrappers import inner, outer

    peft_model = inner(trainer)
    keys = peft_keys(peft_model)
    with torch.no_grad():
        for p in peft_model.parameters():
            if p.requires_grad:
                p.zero_()
    assert load_adapter_into_fsdp(trainer, spec.output_dir, spec.save.resume)
    back = gather_trainable(outer(trainer), also=frozenset(keys))
    saved = load_file(str(Path(spec.output_dir) / ADAPTER_WEIGHTS))
    return all(torch.equal(back[name], saved[key]) for name, key in keys.items())


def reset() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    gc.collect()


def run_plan(plan_path: str, driver: str, train_one, adjust=lambda spec, entry: spec) -> None:
    """Every run of the plan in turn: its rank spec (as `adjust` makes it), `train_one`, rank 0's result in
    OUTPUT_DIR/{driver}_result.json; a failing run writes its traceback there and ends the job."""
    from fsdp_tune.worker.recipe import read_handoff

    plan = json.loads(Path(plan_path).read_text())
    rank = None
    for entry in plan["runs"]:
        spec = adjust(read_handoff(entry["resolved"]).spec, entry)
        if rank is None:
            rank = setup(spec, plan["log_dir"])
        out = Path(spec.output_dir) / f"{driver}_result.json"
        print(f"{driver}_driver: {entry['name']}", flush=True)
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
    run_plan(sys.argv[1], "arch", train_one)
