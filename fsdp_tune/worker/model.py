"""Tokenizer, base model (dtype, attention, QLoRA) and LoraConfig for one rank."""

from __future__ import annotations

from fsdp_tune.config.schema import RunConfig
from fsdp_tune.rules.quant import model_dtype, quant_storage
from fsdp_tune.templates import TEMPLATES


def load_tokenizer(cfg: RunConfig):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model.model_name_or_path, trust_remote_code=cfg.model.trust_remote_code)
    template = TEMPLATES.get(cfg.data.chat_template_format)
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


def attention(cfg: RunConfig) -> str:
    if cfg.model.use_flash_attn:
        return "flash_attention_2"
    return cfg.model.attn_implementation or "sdpa"


def load_model(cfg: RunConfig, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = getattr(torch, model_dtype(cfg))
    kwargs = {"dtype": dtype, "attn_implementation": attention(cfg), "trust_remote_code": cfg.model.trust_remote_code}
    q = cfg.quantization
    if q.use_4bit_quantization:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=q.bnb_4bit_quant_type,
            bnb_4bit_compute_dtype=getattr(torch, q.bnb_4bit_compute_dtype),
            bnb_4bit_use_double_quant=q.use_nested_quant,
            bnb_4bit_quant_storage=getattr(torch, quant_storage(cfg)),
        )
    model = AutoModelForCausalLM.from_pretrained(cfg.model.model_name_or_path, **kwargs)
    if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
        # mean_resizing reads the weights, which sit on the meta device on ranks > 0 under
        # cpu_ram_efficient_loading ("Cannot copy out of meta tensor"): new rows are initialised plainly.
        base_vocab = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=8, mean_resizing=False)
        model.fsdp_tune_vocab_grew_from = base_vocab  # the final save then carries the embedding layers
    model.config.use_cache = False
    return model


def lora_config(cfg: RunConfig):
    from peft import LoraConfig

    lo = cfg.lora
    targets = lo.lora_target_modules
    return LoraConfig(
        r=lo.lora_r,
        lora_alpha=lo.lora_alpha,
        lora_dropout=lo.lora_dropout,
        target_modules="all-linear" if targets == ("all-linear",) else list(targets),
        use_dora=lo.use_dora,
        bias="none",
        task_type="CAUSAL_LM",
    )
