"""`fsdp-tune merge`: fold a LoRA/DoRA adapter into its base model, outside FSDP, and prove it.

Merging under PEFT + FSDP is unsupported (PEFT's FSDP guide, caveat 1), so this runs in one process on
CPU (or one GPU). The base is loaded unquantized even for a QLoRA adapter: merging into 4-bit weights
would round the update into NF4 and lose most of it. Peak host RAM stays near one copy of the model:
the reference logits are computed before merging in place, and the merged copy is reloaded only
after the first is freed.
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

from fsdp_tune.errors import FsdpTuneError, UsageError
from fsdp_tune.runfiles import RESOLVED_NAME

DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
# max |merged - (base + adapter)| / max |logits| accepted per dtype (merging re-rounds the weights)
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


class MergeMismatch(FsdpTuneError):
    exit_code = 1


def _trained_quantized(adapter_dir: Path) -> bool:
    resolved = adapter_dir / RESOLVED_NAME
    if not resolved.exists():
        return False
    data = json.loads(resolved.read_text())
    if "spec" in data:
        return data["spec"]["model"]["quantization"] is not None
    return bool(data["config"]["quantization"]["use_4bit_quantization"])  # a run of fsdp-tune before the rank spec


def merge(
    adapter: str, base: str | None, output: str, dtype: str, max_shard_size: str, device: str, force: bool
) -> dict:
    adapter_dir = Path(adapter)
    if not (adapter_dir / "adapter_config.json").exists():
        raise UsageError(
            f"{adapter} has no adapter_config.json: not a PEFT adapter folder",
            "pass the output dir of a finished run (or one of its checkpoints with a FULL adapter)",
        )
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: unknown", "bf16, fp16 or fp32")
    torch_dtype_name = DTYPES[dtype]
    out = Path(output)
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty; not overwritten", "pass --force, or another -o")
    base = base or json.loads((adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base:
        raise UsageError("the adapter does not record its base model", "pass --base MODEL")

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, torch_dtype_name)
    has_tokenizer = (adapter_dir / "tokenizer_config.json").exists()
    tokenizer = AutoTokenizer.from_pretrained(str(adapter_dir) if has_tokenizer else base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch_dtype, low_cpu_mem_usage=True).to(device)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8, mean_resizing=False)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    inputs = _prompt(tokenizer).to(device)
    with torch.no_grad():
        reference = model(input_ids=inputs).logits.float().cpu()
    merged = model.merge_and_unload()
    merged.save_pretrained(out, max_shard_size=max_shard_size, safe_serialization=True)
    tokenizer.save_pretrained(out)
    del merged, model
    gc.collect()
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch_dtype).to(device).eval()
    with torch.no_grad():
        got = reloaded(input_ids=inputs).logits.float().cpu()
    rel = ((got - reference).abs().max() / reference.abs().max().clamp_min(1e-6)).item()
    result = {
        "output": str(out),
        "base": base,
        "dtype": torch_dtype_name,
        "max_rel_logit_diff": rel,
        "tolerance": TOLERANCE[torch_dtype_name],
        "quantized_adapter": _trained_quantized(adapter_dir),
    }
    if rel > TOLERANCE[torch_dtype_name]:
        raise MergeMismatch(
            f"the merged model's logits differ from base + adapter by {rel:.2e} (relative), above "
            f"{TOLERANCE[torch_dtype_name]:.0e} for {torch_dtype_name}; {out} is not trustworthy"
        )
    return result


def _prompt(tokenizer):
    import torch

    text = PROMPT[0]["content"]
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
