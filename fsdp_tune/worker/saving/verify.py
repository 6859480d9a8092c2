"""After the final save: re-open the adapter and prove it is whole and trained (an error, not a warning).

Catches the known failure where each rank (or only rank 0) wrote its shard: tensors then have 1/world_size
of their rows, or `lora_B` stays all zeros in the layers another rank held. The expected shapes and ranks
come from the live model (expected_adapter): a LoRA pair is `lora_A [k, in]` / `lora_B [out, k]` with one
rank dimension k, which is r for a Linear, the rank_pattern's rank where one matches (PEFT writes one
itself for MoE experts whose projections transformers 5 fused: 2r), and r x experts for PEFT's
ParamWrapper on a fused 3-D expert parameter. `lora_B.bias` (lora_bias) and other tensors are checked
against the model's shapes only.
"""

from __future__ import annotations

import json
from pathlib import Path

from peft.tuners.lora.layer import LoraLayer
from peft.utils.other import get_pattern_key
from safetensors import safe_open

from fsdp_tune.runfiles import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from fsdp_tune.worker.saving.save import adapter_key, peft_keys, resized_embedding_names, uses_fsdp1
from fsdp_tune.worker.wrappers import canonical_name, inner, outer

PARTS = (".lora_A.weight", ".lora_B.weight")


class AdapterIntegrityError(RuntimeError):
    pass


def expected_adapter(trainer) -> tuple[dict[str, tuple[int, ...]] | None, dict[str, int]]:
    """(saved key -> global shape, LoRA module prefix as saved -> rank dimension) from the live model, on every
    rank before the gather (FSDP2 DTensors report global shapes; PEFT sets num_experts before sharding). FSDP1
    flattens the parameters (their shapes are the local flat shard's): ranks only."""
    peft_model = inner(trainer)
    adapter = peft_model.active_adapter
    ranks = {
        canonical_name(name): module.r[adapter] * getattr(module, "num_experts", 1)
        for name, module in peft_model.named_modules()
        if isinstance(module, LoraLayer) and adapter in getattr(module, "r", {})
    }
    if uses_fsdp1(outer(trainer)):
        return None, ranks
    keys = peft_keys(peft_model)
    embeddings = resized_embedding_names(peft_model, trainer.saving.vocab_grew)  # carried when the vocabulary grew
    shapes = {}
    for name, param in peft_model.named_parameters(remove_duplicate=False):
        name = canonical_name(name)
        if name in keys or name in embeddings:
            shapes[adapter_key(name, keys, adapter)] = tuple(param.shape)
    return shapes, ranks


def _rank_for(prefix: str, cfg: dict) -> int:
    """r, or the rank_pattern's rank for this module (from the adapter config alone)."""
    pattern = cfg.get("rank_pattern") or {}
    if pattern:
        key = get_pattern_key(pattern.keys(), prefix.removeprefix("base_model.model."))
        if key in pattern:
            return int(pattern[key])
    return int(cfg["r"])


def _read(path: Path, expected: dict | None, problems: list[str]) -> tuple[dict, int, int, int]:
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    n_b = zero_b = 0
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
        for key in keys:
            t = f.get_tensor(key)
            if expected is not None and key not in expected:
                problems.append(f"{key}: not a tensor of this model's adapter")
            elif expected is not None and tuple(t.shape) != tuple(expected[key]):
                problems.append(f"{key}: shape {tuple(t.shape)}, the model has {tuple(expected[key])}")
            for part in PARTS:
                if key.endswith(part):
                    pairs.setdefault(key[: -len(part)], {})[part] = tuple(t.shape)
            if key.endswith(PARTS[1]):
                n_b += 1
                zero_b += int(not t.abs().sum().item())
    if expected is not None:
        missing = sorted(set(expected) - set(keys))
        if missing:
            problems.append(f"{len(missing)} tensors of the adapter are not in the file, e.g. {missing[0]}")
    return pairs, n_b, zero_b, len(keys)


def verify_adapter(adapter_dir: str, expected: dict | None = None, ranks: dict | None = None) -> dict:
    """Shapes (against the model's when given), one rank dimension per LoRA pair, and lora_B trained."""
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not path.exists():
        raise AdapterIntegrityError(f"{path} is missing")
    cfg = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text())
    problems: list[str] = []
    pairs, n_b, zero_b, n_keys = _read(path, expected, problems)
    for prefix, pair in pairs.items():
        a, b = pair.get(PARTS[0]), pair.get(PARTS[1])
        if a is None or b is None:
            problems.append(f"{prefix}: lora_A and lora_B do not come in a pair")
        elif len(a) != 2 or len(b) != 2 or a[0] != b[1]:
            problems.append(f"{prefix}: lora_A {a} and lora_B {b}: expected one rank dimension (k, in) / (out, k)")
        elif ranks and prefix in ranks:
            if a[0] != ranks[prefix]:
                problems.append(f"{prefix}: rank dimension {a[0]}, the model has {ranks[prefix]} (r x experts)")
        elif a[0] % _rank_for(prefix, cfg):
            problems.append(f"{prefix}: rank dimension {a[0]}, expected a multiple of r={_rank_for(prefix, cfg)}")
    if not pairs:
        problems.append(f"no lora_A / lora_B pairs among {n_keys} tensors")
    if n_b and zero_b == n_b:
        problems.append("every lora_B is all zeros: the adapter is untrained (or only an untrained shard was saved)")
    if problems:
        raise AdapterIntegrityError(f"the saved adapter in {adapter_dir} is broken: " + "; ".join(problems[:5]))
    return {"lora_tensors": 2 * len(pairs), "zero_lora_B": zero_b, "rank": int(cfg["r"]), "ok": True}
