"""Tokenizer, base model (dtype, attention, QLoRA) and LoraConfig for one rank, as the rank spec says."""

from __future__ import annotations

from fsdp_tune.config.templates import TEMPLATES
from fsdp_tune.launch.spec import RankSpec


def load_tokenizer(spec: RankSpec):
    from transformers import AutoTokenizer

    m = spec.model
    revision = {"revision": m.revision} if m.revision else {}
    tok = AutoTokenizer.from_pretrained(m.name_or_path, trust_remote_code=m.trust_remote_code, **revision)
    template = TEMPLATES.get(m.chat_template or "")
    if template is not None:
        # PEFT's examples add the template's special tokens; only the missing ones, so a model that
        # already speaks ChatML keeps its vocabulary (and its embeddings stay the size they were).
        missing = {
            k: template[k] for k in ("bos_token", "eos_token", "pad_token") if template[k] not in tok.get_vocab()
        }
        if missing:
            tok.add_special_tokens(missing)
        for k in ("bos_token", "eos_token", "pad_token"):
            setattr(tok, k, template[k])
        tok.chat_template = template["template"]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def quantization_config(spec: RankSpec):
    """BitsAndBytesConfig from the spec's kwargs (dtypes are names there: the spec is JSON)."""
    import torch
    from transformers import BitsAndBytesConfig

    kwargs = dict(spec.model.quantization or {})
    for key in ("bnb_4bit_compute_dtype", "bnb_4bit_quant_storage"):
        if key in kwargs:
            kwargs[key] = getattr(torch, kwargs[key])
    return BitsAndBytesConfig(**kwargs)


def load_model(spec: RankSpec, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    m = spec.model
    kwargs = {
        "dtype": getattr(torch, m.dtype),
        "attn_implementation": m.attn_implementation,  # None: transformers' own choice (sdpa, else eager)
        "trust_remote_code": m.trust_remote_code,
    }
    if m.revision:
        kwargs["revision"] = m.revision
    if m.quantization:
        kwargs["quantization_config"] = quantization_config(spec)
    model = AutoModelForCausalLM.from_pretrained(m.name_or_path, **kwargs)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        # mean_resizing reads the weights, which sit on the meta device on ranks > 0 under
        # cpu_ram_efficient_loading ("Cannot copy out of meta tensor"): new rows are initialised plainly.
        base_vocab = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8, mean_resizing=False)
        model.fsdp_tune_vocab_grew_from = base_vocab  # the final save then carries the embedding layers
    model.config.use_cache = False
    return model


def lora_config(spec: RankSpec):
    from peft import LoraConfig

    return LoraConfig(**spec.lora) if spec.lora is not None else None
