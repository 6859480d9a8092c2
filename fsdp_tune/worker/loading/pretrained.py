"""The transformers path: the base model through from_pretrained on every rank (dtype, attention, QLoRA's
BitsAndBytesConfig), as the rank spec says; accelerate's fully_shard then shards it in the Trainer. A reward model
is a sequence classifier with one score (its head is new: from_pretrained initialises it)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, BitsAndBytesConfig

from fsdp_tune.decide.spec import ModelSpec, RankSpec


def quantization_config(spec: RankSpec) -> BitsAndBytesConfig:
    """BitsAndBytesConfig from the spec's kwargs (dtypes are names there: the spec is JSON)."""
    kwargs = dict(spec.model.quantization or {})
    for key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
        if key in kwargs:
            kwargs[key] = getattr(torch, kwargs[key])
    return BitsAndBytesConfig(**kwargs)


def load_model(spec: RankSpec, vocab: int) -> tuple[torch.nn.Module, int | None]:
    """(the model, the vocabulary size it had when the tokenizer's `vocab` outgrew it, else None)."""
    m: ModelSpec = spec.model
    kwargs = {
        "dtype": getattr(torch, m.dtype),
        "attn_implementation": m.attn_implementation,  # None: transformers' own choice (sdpa, else eager)
        "trust_remote_code": m.trust_remote_code,
    }
    if m.revision:
        kwargs["revision"] = m.revision
    if m.quantization:
        kwargs["quantization_config"] = quantization_config(spec)
    if spec.method.head == "score":  # RewardTrainer's own choice for a model it loads by name: one score
        model = AutoModelForSequenceClassification.from_pretrained(m.name_or_path, num_labels=1, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(m.name_or_path, **kwargs)
    grew_from = None
    if vocab > model.get_input_embeddings().weight.shape[0]:
        # mean_resizing reads the weights, which sit on the meta device on ranks > 0 under
        # cpu_ram_efficient_loading ("Cannot copy out of meta tensor"): new rows are initialised plainly.
        grew_from = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(vocab, pad_to_multiple_of=8, mean_resizing=False)
    model.config.use_cache = False
    return model, grew_from
