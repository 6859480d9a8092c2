"""The processing class the ranks train with: a language model's tokenizer, or a vision-language model's processor
(models/processor.py loads it, torchvision or not) with the run's chat template on its tokenizer."""

from __future__ import annotations

from fsdp_tune.models.processor import load_processor, save_processor

__all__ = ["load_processing", "load_processor", "save_processor"]


def load_processing(m) -> tuple[object, object | None]:
    """(the tokenizer, the processor or None) the ranks train with, for the rank spec's ModelSpec `m`: a
    vision-language model's processor (its tokenizer carries the run's chat template, and the processor the same)."""
    from fsdp_tune.config.model_kinds import KINDS
    from fsdp_tune.config.templates import apply_template
    from fsdp_tune.worker.loading.tokenizer import load_tokenizer

    if not KINDS[m.kind].processor:
        return load_tokenizer(m), None
    from fsdp_tune.worker.loading.door import open_processor

    processor = open_processor(m.name_or_path, m.trust_remote_code, m.revision)
    processor.tokenizer = apply_template(processor.tokenizer, m.chat_template)
    if processor.tokenizer.chat_template:
        processor.chat_template = processor.tokenizer.chat_template
    return processor.tokenizer, processor
