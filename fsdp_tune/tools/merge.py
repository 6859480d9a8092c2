"""`fsdp-tune merge`: fold a LoRA/DoRA adapter into its base model, outside FSDP, and prove it.

Merging under PEFT + FSDP is unsupported (PEFT's FSDP guide, caveat 1), so this runs in one process on
CPU (or one GPU). The merged model keeps the base model's own dtype unless --dtype says otherwise: an fp32
base stays fp32 (merging it into bf16 would move its logits by ~1e-2).

A QLoRA adapter was trained against the base's 4-bit weights as bitsandbytes dequantizes them, not against
the 16-bit weights on disk. `--into dequantized` (the default for a QLoRA run) quantizes the base with the
run's BitsAndBytesConfig, dequantizes it and merges there: the merged model computes what the run trained and
evaluated, and is checked against the 4-bit base + adapter. `--into base` merges into the 16-bit base (the
weights before quantization, which the adapter never saw), checked against that base + adapter. Merging into
the 4-bit weights themselves would round the update into NF4 and lose most of it; neither does that.

Peak host RAM stays near one copy of the model: the reference logits are computed before merging in
place, and the merged copy is reloaded only after the first is freed.
"""

from __future__ import annotations

import gc
from pathlib import Path

from fsdp_tune.config.folders import check_adapter, read_header, read_json
from fsdp_tune.decide.spec import read_from
from fsdp_tune.errors import FsdpTuneError, UsageError
from fsdp_tune.models.processor import save_processor
from fsdp_tune.runfiles import RESOLVED_NAME
from fsdp_tune.tools.base import (
    check_adapter_folder,
    is_reward_adapter,
    locate,
    model_class,
    recorded_base,
    resize_as_trained,
)
from fsdp_tune.tools.quiet import quiet_transformers
from fsdp_tune.tools.vision import image_prompt, processor_of, reads_images
from fsdp_tune.worker.loading.door import open_adapter, open_model, open_tokenizer, prepared

DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
INTO = ("base", "dequantized")
# max |merged - (base + adapter)| / max |logits| accepted per dtype (merging re-rounds the weights)
TOLERANCE = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


class MergeMismatch(FsdpTuneError):
    exit_code = 1


def _trained_quantized(adapter_dir: Path) -> bool:
    resolved = adapter_dir / RESOLVED_NAME
    if not resolved.exists():
        return False
    data = read_json(resolved)
    try:
        if "spec" in data:
            return data["spec"]["model"]["quantization"] is not None
        return bool(data["config"]["quantization"]["use_4bit_quantization"])  # a run from before the rank spec
    except (KeyError, TypeError):
        raise UsageError(f"{resolved}: not a run record of fsdp-tune's", "pass an adapter folder") from None


def own_dtype(base: str) -> tuple[str, str]:
    """The base model's own dtype and where it was read: config.json's `dtype` (`torch_dtype` before
    transformers 4.56), else the dtype most of its safetensors weights have (their headers read through the
    bounded reader); float32 when neither tells. `base`: the folder locate() found."""
    from fsdp_tune.sources.model import fetch_config

    folder = Path(base)
    config = fetch_config(base) or {}
    name = str(config.get("dtype") or config.get("torch_dtype") or "").removeprefix("torch.")
    if name in DTYPES:
        return DTYPES[name], "the base's own, from config.json"
    counts: dict[str, int] = {}
    for shard in sorted(folder.glob("*.safetensors"))[:1] if folder.is_dir() else []:
        for entry in read_header(shard).values():
            kind = SAFETENSORS_DTYPES.get(entry["dtype"])
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
    if counts:
        return max(counts, key=counts.__getitem__), "the base's own, from its safetensors weights"
    return "float32", "the base's own dtype could not be read"


def merge(
    adapter: str,
    base: str | None,
    output: str,
    dtype: str | None,
    max_shard_size: str,
    device: str,
    force: bool,
    into: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """Merge, save, reload and compare; returns what was done. `dtype` None: the base's own; `into` None:
    dequantized for a QLoRA run, base otherwise. Every folder goes through the loader door (`_opened`)."""
    adapter_dir, out = Path(adapter), Path(output)
    shown = _checked(adapter_dir, base, out, dtype, force)
    quantized = _trained_quantized(adapter_dir)
    into = _into(into, quantized, adapter)
    base, trust = _opened(adapter_dir, shown, base is not None, trust_remote_code)

    import torch

    quiet_transformers()  # the result lines are the output
    dtype_name, dtype_source = (DTYPES[dtype], "as --dtype asked") if dtype else own_dtype(base)
    torch_dtype = getattr(torch, dtype_name)
    tokenizer, processor = _processing(adapter_dir, base, trust)
    inputs = _inputs(tokenizer, processor, device)
    load = _dequantized if into == "dequantized" else _unquantized
    model, reference, tolerance = load(base, adapter_dir, tokenizer, torch_dtype, device, inputs, trust)
    merged = model.merge_and_unload()
    if is_reward_adapter(adapter_dir):  # a sequence classifier pools at the last token that is not padding
        merged.config.pad_token_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    merged.save_pretrained(out, max_shard_size=max_shard_size, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if processor is not None:  # a vision-language model's processor travels with it (models/processor.py)
        save_processor(processor, out)
    del merged, model
    gc.collect()
    auto, _ = model_class(adapter_dir, base)  # a reward model's: AutoModelForSequenceClassification
    reloaded = open_model(auto, str(out), trust, dtype=torch_dtype).to(device).eval()
    with torch.no_grad():
        got = reloaded(**inputs).logits.float().cpu()
    rel = ((got - reference).abs().max() / reference.abs().max().clamp_min(1e-6)).item()
    result = {
        "output": str(out),
        "base": shown,
        "dtype": dtype_name,
        "dtype_source": dtype_source,
        "into": into,
        "max_rel_logit_diff": rel,
        "tolerance": tolerance,
        "quantized_adapter": quantized,
    }
    if rel > tolerance:
        raise MergeMismatch(
            f"the merged model's logits differ from base + adapter by {rel:.2e} (relative), above "
            f"{tolerance:.0e} for {dtype_name}; {out} is not trustworthy"
        )
    return result


def _opened(adapter_dir: Path, shown: str, given: bool, trust_remote_code: bool) -> tuple[str, bool]:
    """(the base's folder on this machine, trust_remote_code), every folder checked at the loader door before
    torch is imported: a folder refused answers at once. Trusted: --trust_remote_code, or the run's own setting."""
    check_adapter(adapter_dir)  # bounded before PEFT reads it (config/folders.py)
    spec = read_from(adapter_dir)
    base = locate(shown, adapter_dir, given=given)
    trust = trust_remote_code or (spec is not None and spec.model.trust_remote_code)
    prepared(base, trust)
    prepared(str(adapter_dir), trust, "the adapter's tokenizer")
    return base, trust


def _checked(adapter_dir: Path, base: str | None, out: Path, dtype: str | None, force: bool) -> str:
    """The arguments, before anything heavy is imported; returns the base model to merge into."""
    check_adapter_folder(adapter_dir, "a PEFT adapter folder")
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype}: unknown", "bf16, fp16 or fp32")
    holds = _holds_a_run(out, adapter_dir)
    if holds:  # --force or not: a full model written into a run's folder overwrites or confuses what is there
        raise UsageError(
            f"-o {out} {holds}: merging there would write a full model over it (and beside its adapter)",
            f"-o {adapter_dir.name.rstrip('/') or 'run'}-merged (a new folder)",
        )
    if out.exists() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty; not overwritten", "pass --force, or another -o")
    return base or recorded_base(adapter_dir)


def _holds_a_run(out: Path, adapter_dir: Path) -> str | None:
    """What in `out` a merge must not write into: the adapter's own folder, another adapter, a run's folder."""
    from fsdp_tune.rundir.outdir import inspect

    if out.exists() and out.resolve() == adapter_dir.resolve():
        return "is the adapter's own folder"
    if (out / "adapter_config.json").exists():
        return "holds an adapter"
    if inspect(out).kind == "run":
        return "holds a run"
    return None


def _into(into: str | None, quantized: bool, adapter: str) -> str:
    if into is None:
        return "dequantized" if quantized else "base"
    if into not in INTO:
        raise UsageError(f"--into {into}: unknown", "base or dequantized")
    if into == "dequantized" and not quantized:
        raise UsageError(
            f"--into dequantized: {adapter} was not trained against 4-bit weights (no QLoRA run of fsdp-tune)",
            "--into base (the default here)",
        )
    return into


def _unquantized(base: str, adapter_dir: Path, tokenizer, torch_dtype, device: str, inputs, trust: bool):
    """The 16-bit base in `torch_dtype` with the adapter; the reference is that model's logits."""
    import torch

    auto, extra = model_class(adapter_dir, base)
    model = open_model(auto, base, trust, dtype=torch_dtype, low_cpu_mem_usage=True, **extra).to(device)
    resize_as_trained(model, tokenizer)
    model = open_adapter(model, adapter_dir).eval()
    with torch.no_grad():
        reference = model(**inputs).logits.float().cpu()
    return model, reference, TOLERANCE[str(torch_dtype).removeprefix("torch.")]


def _dequantized(base: str, adapter_dir: Path, tokenizer, torch_dtype, device: str, inputs, trust: bool):
    """The base quantized as the run quantized it, with the adapter: the reference (what training computed).
    Then the same 4-bit weights dequantized to `torch_dtype`, with the adapter again, to merge."""
    import torch

    from fsdp_tune.worker.loading.pretrained import quantization_config

    spec = read_from(adapter_dir)
    q = spec.model.quantization
    auto, extra = model_class(adapter_dir, base)
    model = open_model(
        auto,
        base,
        trust,
        dtype=getattr(torch, spec.model.dtype),
        quantization_config=quantization_config(spec),
        device_map={"": device},
        **extra,
    )
    resize_as_trained(model, tokenizer)
    trained = _as_in_training(open_adapter(model, adapter_dir).eval())
    with torch.no_grad():
        reference = trained(**inputs).logits.float().cpu()
    model = trained.unload().dequantize(dtype=torch_dtype).to(torch_dtype)
    model = open_adapter(model, adapter_dir).eval()
    # the 4-bit forward computes in bnb_4bit_compute_dtype: the check is as fine as the coarser of the two
    tolerance = max(TOLERANCE[str(torch_dtype).removeprefix("torch.")], TOLERANCE[q.bnb_4bit_compute_dtype])
    return model, reference, tolerance


def _as_in_training(model):
    """The 4-bit layers on bitsandbytes' training path, where they dequantize and multiply in the compute dtype
    as the run did. In eval mode without gradients, on CPUs with AVX512-BF16, bitsandbytes instead repacks the
    weights in place for a bfloat16 kernel: other numbers than training's, and weights that no longer
    dequantize. Only the bitsandbytes layers: LoRA's dropout stays off."""
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.train()
    return model


def _processing(adapter_dir: Path, base: str, trust: bool):
    """(the tokenizer, a vision-language model's processor or None): the run's own where it saved them."""
    if reads_images(base):
        processor = processor_of(adapter_dir, base, trust)
        return processor.tokenizer, processor
    has_tokenizer = (adapter_dir / "tokenizer_config.json").exists()
    return open_tokenizer(str(adapter_dir) if has_tokenizer else base, trust), None


def _inputs(tokenizer, processor, device: str) -> dict:
    """The check's prompt: a question, with an image for a vision-language model (its tower and projector then
    run too, as an adapter on them needs)."""
    if processor is not None:
        from PIL import Image

        image = Image.new("RGB", (64, 48), (200, 120, 40))
        return dict(image_prompt(processor, PROMPT[0]["content"], image, device))
    return {"input_ids": _prompt(tokenizer).to(device)}


def _prompt(tokenizer):
    import torch

    from fsdp_tune.config.templates import render_prompt

    text = PROMPT[0]["content"]
    if getattr(tokenizer, "chat_template", None):
        text = render_prompt(tokenizer, PROMPT, "the adapter's chat template")
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
