"""GRPO's prompts, converted once: rank 0 of each machine reads every source, turns each row into TRL's own
({prompt, every other column}: sources/prompts.py), skips and counts the rows that cannot be used, leaves out the
prompts that leave no room for a completion (more than max_seq_len - max_completion_length tokens, with the chat
template applied as TRL applies it), mixes the sources and saves the result; every other rank reads that result, as
the other methods' data is prepared (worker/data/prepare.py).

GRPOTrainer does not cut prompts (TRL 1.16 has no max_prompt_length): a prompt that fills the context would be
generated from anyway, so it is left out here and said.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.prompts import canonical, detect_prompts
from fsdp_tune.worker.data.columns import Columns
from fsdp_tune.worker.data.columns import build as build_columns
from fsdp_tune.worker.data.prepare import Prepared, cache_key, load_prepared

TOO_LONG = "the prompt leaves no room for a completion within max_seq_len"


def prepare_prompts(spec: RankSpec, tokenizer, processor=None) -> Prepared:
    """(train, eval or None, the data report): TRL's prompt rows, converted once by rank 0 of each machine
    (`processor`: a vision-language model's, which GRPO does not take: FT126)."""
    limit = spec.generating.max_prompt_tokens if spec.generating else None
    key = hashlib.sha256(f"{cache_key(spec, tokenizer)}:grpo:{limit}".encode()).hexdigest()[:16]
    return load_prepared(spec, tokenizer, key, build)


def prompt_tokens(tokenizer, prompt) -> int:
    """The prompt's length as GRPOTrainer tokenizes it (_tokenize_prompts: the chat template with the generation
    prompt for a conversation, the text as it is otherwise)."""
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        return len(ids["input_ids"] if isinstance(ids, dict) else ids)
    return len(tokenizer(text=prompt)["input_ids"])


def kind(tokenizer, limit: int | None) -> Columns:
    """GRPO's prompt rows; with a `limit`, a prompt of more tokens than it is left out (TOO_LONG)."""

    def read(row: dict, fmt: Format) -> tuple[list[dict], str | None]:
        converted, problem = canonical(row, fmt)
        if problem is not None:
            return [], problem.reason
        if limit is not None and prompt_tokens(tokenizer, converted["prompt"]) > limit:
            return [], f"{TOO_LONG} (more than {limit} tokens)"
        return [converted], None

    return Columns(
        detect=detect_prompts,
        read=read,
        loss="completions",
        rows_are="prompts",
        usable="used",
        hint=lambda reasons: " (raise --max_seq_len, or lower --max_completion_length)" if TOO_LONG in reasons else "",
    )


def build(spec: RankSpec, tokenizer, folder: Path) -> None:
    """Convert, mix and save; the folder appears whole or not at all."""
    limit = spec.generating.max_prompt_tokens if spec.generating else None
    build_columns(kind(tokenizer, limit), spec, tokenizer, folder)
