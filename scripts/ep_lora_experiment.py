"""Expert parallelism with LoRA on CPU ranks: which ways of attaching LoRA to a model that transformers sharded at load
(`from_pretrained(distributed_config=DistributedConfig(fsdp_size=2, ep_size=...))`) train, and whether they train
the same run at ep_size 2 and 1.

Run: `python -m torch.distributed.run --nproc_per_node 2 scripts/ep_lora_experiment.py FAMILY OUT.json [CASE ...]`
(FAMILY: qwen3_moe or mixtral, built from a fixed seed into a temporary folder by rank 0; CASE: STRATEGY:ep=N or
STRATEGY:tp=N, default every case in CASES, one after another in this one launch). Each data-parallel rank trains on
its own batch; a case's record is every step's loss averaged over the ranks, whether the first adapter tensor is the
same on every rank after training, or the failure's last frames.

Strategies:
  attn_after       LoRA on q_proj/v_proj attached after the sharded load, as a user would (get_peft_model)
  experts_after    LoRA on the fused experts (target_parameters) attached after the sharded load
  attn_all_after   attn_after on q_proj, k_proj, v_proj and o_proj (o_proj is row-parallel under tp_size)
  attn_reduced     attn_after, plus the adapters' gradients averaged over the data-parallel ranks after backward
                   (what transformers' Trainer does for it, and what fsdp-tune runs); then the adapter saved with
                   PEFT's save_pretrained and the sharded model's logits on a fixed row beside it
  attn_sharded     attn_after, then each lora_A/lora_B module sharded with FSDP2's fully_shard on the model's fsdp mesh,
                   so FSDP all-gathers them for compute and reduce-scatters (averages) their gradients

Findings on CPU (torch 2.11, transformers 5.24, peft 0.21; tests/dist/test_expert_parallel.py keeps them true):
  - LoRA on the fused experts fails at ep_size 2 in the first forward: "aten.baddbmm.default got mixed torch.Tensor
    and DTensor" at peft/tuners/lora/layer.py:2323 (_LoraFactorsProxy.forward), reached from the parametrization
    registered at peft/tuners/lora/layer.py:2594 (ParamWrapper._activate_lora). Why: at ep_size > 1 transformers
    makes each experts module an FSDP2 unit of its own on the (efsdp, ep) mesh
    (transformers/distributed/fsdp.py:202, `fully_shard(module, mesh=expert_mesh)`), so its gate_up_proj/down_proj
    stay sharded DTensors until that module's own pre-forward; PEFT's ParamWrapper sits *around* the experts module
    and folds W + B@A before that pre-forward runs, with plain-tensor factors sized for every expert. (At ep_size 1
    the experts are inside the decoder layer's FSDP unit, already gathered to plain tensors, so the same LoRA runs.)
    Even with DTensor factors the experts' forward would index the parametrized weight with *local* expert ids,
    while transformers' `_use_local_dtensor_params` (transformers/distributed/parallel_utils.py:68) turns only the
    module's own `_parameters` into local tensors, not a parametrized one (read, not run).
  - LoRA on attention attached after the sharded load trains but is not managed by FSDP: each rank trains its own
    adapter (after 3 steps the first lora_A differs across ranks), transformers#48792.
  - LoRA on attention attached after the load and then sharded with FSDP2's fully_shard on the model's own fsdp
    mesh (each lora_A/lora_B module a unit): the adapters are DTensors, identical on every rank, and the losses at
    ep_size 2 and ep_size 1 agree step by step (equal to float32 print precision on both families).
  - tp_size 2 (fsdp_size 1): LoRA on q_proj/v_proj (column-parallel) runs; LoRA on o_proj (row-parallel) fails in
    the forward: "shape '[32, 16]' is invalid for input of size 1024", raised through
    transformers/distributed/tensor_parallel.py:136 (tp_forward) from peft/tuners/lora/layer.py:1102,
    lora_B(lora_A(x)).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

STEPS = 3
SEQ = 16
PROBE = torch.arange(1, 17).unsqueeze(0)  # the row whose logits the sharded and the reloaded model must agree on
CASES = ("experts_after:ep=2", "attn_after:ep=2", "attn_sharded:ep=2", "attn_sharded:ep=1", "attn_after:tp=2")
FAMILIES = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
        ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    ),
    "mixtral": (
        "MixtralConfig",
        dict(num_local_experts=4, num_experts_per_tok=2),
        ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"],
    ),
}


def build(family: str, out: str) -> None:
    import transformers

    cls_name, extra, _ = FAMILIES[family]
    config = getattr(transformers, cls_name)(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
        dtype="float32",
        **extra,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(out)


def lora_config(family: str, strategy: str):
    from peft import LoraConfig

    if strategy.startswith("experts"):
        _, _, params = FAMILIES[family]
        return LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=params, lora_dropout=0.0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"] if strategy.startswith("attn_all") else ["q_proj", "v_proj"]
    return LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)


def reduce_adapter_grads(model) -> None:
    """Average each adapter gradient over the data-parallel ranks (here every rank: fsdp_size == world size)."""
    for name, p in model.named_parameters():
        if p.requires_grad and "lora_" in name and p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def shard_adapters(model) -> None:
    """FSDP2 units for the adapters, on the mesh transformers built for the dense modules."""
    from torch.distributed.fsdp import fully_shard

    mesh = model.base_model.model._mesh_manager.get_mesh(("fsdp", "tp"))
    for name, module in model.named_modules():
        if name.endswith((".lora_A.default", ".lora_B.default")):
            fully_shard(module, mesh=mesh, reshard_after_forward=True)


def save_with_logits(model, save_dir: str) -> None:
    """The adapter as PEFT saves it (a collective: every rank calls it, rank 0 writes) and the sharded model's
    logits on a fixed row, for a test to reload the adapter outside any mesh and compare."""
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=PROBE).logits
    model.save_pretrained(save_dir, is_main_process=dist.get_rank() == 0)
    if dist.get_rank() == 0:
        torch.save(logits, os.path.join(save_dir, "sharded_logits.pt"))
    dist.barrier()


def train(path: str, family: str, strategy: str, sizes: dict, save_dir: str) -> dict:
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    rank = dist.get_rank()
    model = AutoModelForCausalLM.from_pretrained(
        path, distributed_config=DistributedConfig(**sizes), dtype=torch.float32
    )
    torch.manual_seed(1)  # the same LoRA init on every rank and at every ep_size
    model = get_peft_model(model, lora_config(family, strategy))
    if strategy.endswith("sharded"):
        shard_adapters(model)
    trainable = {n: tuple(p.shape) for n, p in model.named_parameters() if p.requires_grad}
    kinds = sorted({type(p).__name__ for p in model.parameters() if p.requires_grad})
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank // sizes.get("tp_size", 1))  # a TP group shares its batch
    losses = []
    for _ in range(STEPS):
        ids = torch.randint(0, 128, (2, SEQ), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if strategy.endswith("reduced"):
            reduce_adapter_grads(model)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    first = next(p for n, p in model.named_parameters() if p.requires_grad)
    local = first.full_tensor() if hasattr(first, "full_tensor") else first.detach()
    others = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(others, local.contiguous())
    same = all(torch.equal(others[0], o) for o in others)
    if strategy.endswith("reduced"):
        save_with_logits(model, save_dir)
    return {"losses": losses, "trainable": len(trainable), "param_types": kinds, "adapter_same_on_ranks": same}


def run_case(path: str, family: str, case: str, root: str) -> dict:
    strategy, _, size = case.partition(":")
    kind, _, n = size.partition("=")
    sizes = {"fsdp_size": 2, "ep_size": int(n)} if kind == "ep" else {"tp_size": int(n)}
    try:
        save_dir = os.path.join(root, case.replace(":", "-").replace("=", ""))
        record = {"ok": True, "saved": save_dir, **train(path, family, strategy, sizes, save_dir)}
    except Exception as exc:  # the record is the experiment's result
        frames = traceback.extract_tb(exc.__traceback__)[-14:]
        record = {
            "ok": False,
            "error": f"{type(exc).__name__}: {str(exc)[:400]}",
            "frames": [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in frames],
        }
    dist.barrier()
    return {"case": case, "family": family, "sizes": sizes, **record}


def main() -> None:
    family, out, cases = sys.argv[1], sys.argv[2], sys.argv[3:] or CASES
    dist.init_process_group("gloo")
    path = os.path.join(os.path.dirname(os.path.abspath(out)), f"tiny-{family}")
    if dist.get_rank() == 0 and not os.path.isdir(path):
        build(family, path)
    dist.barrier()
    records = [run_case(path, family, case, os.path.dirname(path)) for case in cases]
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(records, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
