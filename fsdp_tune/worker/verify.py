"""After the final save: re-open the adapter and prove it is whole and trained (an error, not a warning).

Catches the known failure where each rank (or only rank 0) wrote its shard: LoRA tensors then have
1/world_size of their rows, or `lora_B` stays all zeros in the layers another rank held.
"""

from __future__ import annotations

import json
from pathlib import Path


class AdapterIntegrityError(RuntimeError):
    pass


def verify_adapter(adapter_dir: str, base_shapes: dict | None = None) -> dict:
    """Check shapes (lora_A: [r, in], lora_B: [out, r]) and that lora_B is not all zero in every layer."""
    from safetensors import safe_open

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.exists():
        raise AdapterIntegrityError(f"{path} is missing")
    adapter_cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    rank = int(adapter_cfg["r"])
    problems: list[str] = []
    n_a = n_b = zero_b = 0
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
        for key in keys:
            t = f.get_tensor(key)
            if ".lora_A." in key:
                n_a += 1
                if t.ndim != 2 or t.shape[0] != rank:
                    problems.append(f"{key}: shape {tuple(t.shape)}, expected ({rank}, in_features)")
            elif ".lora_B." in key:
                n_b += 1
                if t.ndim != 2 or t.shape[1] != rank:
                    problems.append(f"{key}: shape {tuple(t.shape)}, expected (out_features, {rank})")
                if not t.abs().sum().item():
                    zero_b += 1
            if base_shapes and key in base_shapes and tuple(t.shape) != tuple(base_shapes[key]):
                problems.append(f"{key}: shape {tuple(t.shape)}, the model has {tuple(base_shapes[key])}")
    if not n_a or n_a != n_b:
        problems.append(f"{n_a} lora_A and {n_b} lora_B tensors")
    if n_b and zero_b == n_b:
        problems.append("every lora_B is all zeros: the adapter is untrained (or only an untrained shard was saved)")
    if problems:
        raise AdapterIntegrityError(f"the saved adapter in {adapter_dir} is broken: " + "; ".join(problems[:5]))
    return {"lora_tensors": n_a + n_b, "zero_lora_B": zero_b, "rank": rank, "ok": True}
