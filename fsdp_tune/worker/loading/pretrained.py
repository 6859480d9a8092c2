"""The transformers path: the base model through from_pretrained on every rank (dtype, attention, QLoRA's
BitsAndBytesConfig), as the rank spec says; accelerate's fully_shard then shards it in the Trainer, or, under expert
parallelism, transformers shards it as it loads (DistributedConfig: FSDP2 on its mesh, each rank its share of the
experts) and the Trainer takes it as it is. A reward model is a sequence classifier with one score (its head is new:
from_pretrained initialises it)."""

from __future__ import annotations

import torch
import transformers
from transformers import AutoModelForSequenceClassification, BitsAndBytesConfig

from fsdp_tune.config.model_kinds import KINDS, kind_of
from fsdp_tune.decide.spec import ModelSpec, RankSpec
from fsdp_tune.worker.loading.door import open_config, open_model


def quantization_config(spec: RankSpec) -> BitsAndBytesConfig:
    """BitsAndBytesConfig from the spec's typed quantization (dtypes are names there: the spec is JSON)."""
    q = spec.model.quantization
    assert q is not None  # asked for a quantized model only
    return BitsAndBytesConfig(
        load_in_4bit=q.load_in_4bit,
        bnb_4bit_quant_type=q.bnb_4bit_quant_type,
        bnb_4bit_compute_dtype=getattr(torch, q.bnb_4bit_compute_dtype),
        bnb_4bit_use_double_quant=q.bnb_4bit_use_double_quant,
        bnb_4bit_quant_storage=getattr(torch, q.bnb_4bit_quant_storage),
    )


def auto_class(m: ModelSpec):
    """The Auto class of the model's kind (config/model_kinds.py). A model the launcher could not read (a hub id
    not on that machine) was taken as the kind of a config it has not seen (a language model): one of another kind
    (a vision tower) stops here, before any weight."""
    if m.facts.config is None:
        revision = {"revision": m.revision} if m.revision else {}
        config = open_config(m.name_or_path, m.trust_remote_code, **revision)
        found = KINDS[kind_of(config.to_dict())]
        if found.name != m.kind:
            raise RuntimeError(
                f"{m.name_or_path} is a {found.title} ({config.model_type}), and the launcher could not read its "
                "config.json to plan it as one: download it first (hf download NAME), then train again"
            )
    return getattr(transformers, KINDS[m.kind].auto_class)


def load_model(spec: RankSpec, vocab: int) -> tuple[torch.nn.Module, int | None]:
    """(the model, the vocabulary size it had when the tokenizer's `vocab` outgrew it, else None); opened through
    the loader door (worker/loading/door.py) with the run's trust_remote_code."""
    m: ModelSpec = spec.model
    kwargs = {
        "dtype": getattr(torch, m.dtype),
        "attn_implementation": m.attn_implementation,  # None: transformers' own choice (sdpa, else eager)
    }
    if m.revision:
        kwargs["revision"] = m.revision
    if m.quantization:
        kwargs["quantization_config"] = quantization_config(spec)
    if spec.loading.distributed_config:
        from transformers.distributed import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(**spec.loading.distributed_config.kwargs())
    if spec.method.head == "score":  # RewardTrainer's own choice for a model it loads by name: one score
        classifier = AutoModelForSequenceClassification
        model = open_model(classifier, m.name_or_path, m.trust_remote_code, num_labels=1, **kwargs)
    else:
        model = open_model(auto_class(m), m.name_or_path, m.trust_remote_code, **kwargs)
    grew_from = None
    if vocab > model.get_input_embeddings().weight.shape[0]:
        # mean_resizing reads the weights, which sit on the meta device on ranks > 0 under
        # cpu_ram_efficient_loading ("Cannot copy out of meta tensor"): new rows are initialised plainly.
        grew_from = model.get_input_embeddings().weight.shape[0]
        model.resize_token_embeddings(vocab, pad_to_multiple_of=8, mean_resizing=False)
    model.config.use_cache = False
    if spec.lora is None:
        freeze_vision(model, m.vision)
    return model, grew_from


def freeze_vision(model, vision) -> None:
    """Full fine-tuning of a vision-language model: the vision tower and the projector stay frozen unless
    --freeze_vision_tower / --freeze_multi_modal_projector false (under LoRA the adapter's targets say it)."""
    if vision is None:
        return
    for path, trains in ((vision.tower, vision.train_tower), (vision.projector, vision.train_projector)):
        for p in model.get_submodule(path).parameters():
            p.requires_grad_(trains)
