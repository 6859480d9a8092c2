"""GRPO's two generation paths on 2 CPU ranks, on the same FSDP2-sharded tiny Llama with a LoRA adapter whose B is not
zero (so the adapter changes the logits), in the units accelerate makes (worker/loading/units.py apply_fsdp2):
transformers' generate() as today (every unit all-gathered again per token), then through
worker/training/generation.py install(..., "gathered") (the model gathered once). Greedy decoding; each rank has its
own prompts and rank 1 stops after 3 new tokens where rank 0 goes on to 8, so the ranks finish decoding apart: on
today's path synced_gpus keeps them stepping together (every forward all-gathers); gathered, no forward calls a
collective, so each rank stops when its own completions end (GenerationSpec.synced is off there). FSDP2's
all-gathers are counted (_fsdp_param_group.foreach_all_gather, the one call every unshard makes), and the forwards
each rank ran.

torchrun --standalone --nproc_per_node 2 tests/dist/generation_driver.py OUT_DIR   (writes OUT_DIR/rank-K.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _model(mesh):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fsdp_tune.worker.loading.units import apply_fsdp2

    torch.manual_seed(0)  # the same weights on both ranks, as a loaded checkpoint
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0, eos_token_id=None, bos_token_id=None,
    )  # fmt: skip
    model = get_peft_model(
        LlamaForCausalLM(config), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    layers = (type(model.get_base_model().model.layers[0]),)
    apply_fsdp2(model, layers, mesh=mesh, reshard_after_forward=True)  # the units accelerate 1.15 makes
    return model


def main(out: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as groups
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from fsdp_tune.worker.training.generation import GenerationClock, fsdp_modules, install

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = _model(init_device_mesh("cpu", (2,)))
    gathers = [0]
    original = groups.foreach_all_gather

    def counted(*args, **kwargs):
        gathers[0] += 1
        return original(*args, **kwargs)

    groups.foreach_all_gather = counted
    prompts = torch.randint(1, 96, (2, 5), generator=torch.Generator().manual_seed(rank))
    kwargs = {"input_ids": prompts, "attention_mask": torch.ones_like(prompts), "do_sample": False}
    kwargs["max_new_tokens"] = 8 if rank == 0 else 3
    with torch.no_grad():
        model(input_ids=prompts)  # through the root first: FSDP2 takes the first module to run forward as its root
        gathers[0] = 0
        sharded = model.generate(**kwargs, synced_gpus=True)  # today's path
        per_token, gathers[0] = gathers[0], 0
        clock = GenerationClock()
        install(model, "gathered", synced=False, clock=clock)  # as the launcher decides it for the gathered path
        forwards = [0]
        counting = model.get_input_embeddings()  # every forward starts there
        hook = counting.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        once = model.generate(**kwargs)
        hook.remove()
        first, gathers[0] = gathers[0], 0
        again = model.generate(**kwargs)
        second = gathers[0]
    units = fsdp_modules(model)
    resharded = all(isinstance(p, DTensor) for p in model.parameters())
    layer = units[1]._get_fsdp_state()._fsdp_param_groups[0]
    model(input_ids=prompts).logits.sum().backward()  # training after: the units reshard after forward again
    result = {
        "equal": torch.equal(sharded, once) and torch.equal(once, again),
        "new_tokens": sharded.shape[1] - prompts.shape[1],
        "gathered_forwards": forwards[0],
        "per_token_gathers": per_token,
        "gathered_gathers": [first, second],
        "units": len(units),
        "resharded": resharded,
        "layer_reshards_after_forward": layer._reshard_after_forward,
        "generations_timed": clock.calls,
        "grads": all(p.grad is not None for p in model.parameters() if p.requires_grad),
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
