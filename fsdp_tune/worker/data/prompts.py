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
from typing import Any

from datasets import Dataset

from fsdp_tune.decide.spec import RankSpec
from fsdp_tune.sources.formats import Format
from fsdp_tune.sources.mixture import Source
from fsdp_tune.sources.prompts import canonical, detect_prompts
from fsdp_tune.sources.rows import LISTED, where
from fsdp_tune.worker.data.mixing import columns_report, mix, publish, save_columns, work_folder
from fsdp_tune.worker.data.prepare import Prepared, cache_key, check_template, load_prepared
from fsdp_tune.worker.data.splits import detected, load_split

TOO_LONG = "the prompt leaves no room for a completion within max_seq_len"


def prepare_prompts(spec: RankSpec, tokenizer, processor=None) -> Prepared:
    """(train, eval or None, the data report): TRL's prompt rows, converted once by rank 0 of each machine
    (`processor`: a vision-language model's, which GRPO does not take: FT126)."""
    limit = spec.grpo.max_prompt_tokens if spec.grpo else None
    key = hashlib.sha256(f"{cache_key(spec, tokenizer)}:grpo:{limit}".encode()).hexdigest()[:16]
    return load_prepared(spec, tokenizer, key, build)


def prompt_tokens(tokenizer, prompt) -> int:
    """The prompt's length as GRPOTrainer tokenizes it (_tokenize_prompts: the chat template with the generation
    prompt for a conversation, the text as it is otherwise)."""
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
        return len(ids["input_ids"] if isinstance(ids, dict) else ids)
    return len(tokenizer(text=prompt)["input_ids"])


def convert(raw, fmt: Format, named: str, tokenizer, limit: int | None) -> tuple[list[dict], dict[str, Any]]:
    out: list[dict] = []
    skipped: dict[str, dict[str, Any]] = {}
    for index, row in enumerate(raw):
        converted, problem = canonical(row, fmt)
        reason = problem.reason if problem is not None else None
        if reason is None and limit is not None and prompt_tokens(tokenizer, converted["prompt"]) > limit:
            reason = f"{TOO_LONG} (more than {limit} tokens)"
        if reason is not None:
            seen = skipped.setdefault(reason, {"count": 0, "rows": []})
            seen["count"] += 1
            if len(seen["rows"]) < LISTED:
                seen["rows"].append(f"{named} {index + 1}")
            continue
        out.append(converted)
    return out, {"rows": len(raw), "sequences": len(out), "skipped": skipped}


def _split(raw, source: Source, split: str, fmt: Format, tokenizer, limit) -> tuple[Any, dict[str, Any]]:
    rows, part = convert(raw, fmt, where(source, split), tokenizer, limit)
    if not rows:
        reasons = "; ".join(f"{seen['count']} row(s): {r}" for r, seen in part["skipped"].items())
        hint = " (raise --max_seq_len, or lower --max_completion_length)" if TOO_LONG in reasons else ""
        raise ValueError(f"{source.label}: no row of the {split} split can be used ({reasons or 'no rows'}){hint}")
    return Dataset.from_list(rows), part


def build(spec: RankSpec, tokenizer, folder: Path) -> None:
    """Convert, mix and save; the folder appears whole or not at all."""
    work = work_folder(folder)
    limit = spec.grpo.max_prompt_tokens if spec.grpo else None
    trains, evals, reports = [], [], []
    for source in spec.data.sources:
        raw = load_split(source, source.split)
        fmt = detected(source, raw, detect_prompts)
        if fmt.conversational:
            check_template(tokenizer, Format("messages", {}), source)
        train, part = _split(raw, source, source.split, fmt, tokenizer, limit)
        trains.append(train)
        reports.append(_report(source, fmt, part))
        if source.eval_split:
            held, held_part = _split(
                load_split(source, source.eval_split), source, source.eval_split, fmt, tokenizer, limit
            )
            evals.append(held)
            reports[-1]["eval"] = _report(source, fmt, held_part)
    train, evaluation, counts = mix(spec, trains, evals)
    report = columns_report(reports, counts, train, evaluation)
    save_columns(train, evaluation, report, work / "out")
    publish(work, folder)
    print_report(report)


def _report(source: Source, fmt: Format, part: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": source.label,
        "format": fmt.describe(),
        "kind": fmt.kind,
        "notes": list(fmt.notes),
        "loss": "completions",
        "truncated": 0,
        "template_notes": {},
        **part,
    }


def print_report(report: dict[str, Any]) -> None:
    """What rank 0 says about the data before training (the summary repeats it)."""
    for s in report["sources"]:
        print(f"fsdp-tune: data: {s['source']}: {s['format']}, {s['rows']} rows -> {s['sequences']} prompts")
        for reason, seen in s["skipped"].items():
            rows = ", ".join(seen["rows"])
            print(f"fsdp-tune: warning: {seen['count']} row(s) of {s['source']} skipped: {reason} ({rows})")
