"""Text for people about the data (run.py's lines for it, kept here to keep run.py small): what the
plan says each source is and trains on, and what the summary says was skipped and how much was in the loss."""

from __future__ import annotations

from typing import Any

from fsdp_tune.decide.datafiles import Counted
from fsdp_tune.decide.spec import DataSpec
from fsdp_tune.sources.formats import PROMPT_KINDS, TEXT

# TRL's packing strategies (SFTConfig.packing_strategy), as the plan says them
PACKING = {
    "bfd": "best-fit decreasing: whole sequences share rows of up to {n} tokens, a longer one is cut",
    "bfd_split": "best-fit decreasing: sequences share rows of up to {n} tokens, a longer one is split across rows",
    "wrapped": "the sequences are concatenated and cut into rows of {n} tokens, across their boundaries",
}


def plan_lines(data: DataSpec, packing_strategy: str | None = None, counted: tuple[Counted, ...] = ()) -> list[str]:
    """One line per source: its format (detected here, or on rank 0 for a Hub dataset), what is in the loss,
    its share of a mixture, its held-out split and what the pre-flight's tokenizing found; then packing."""
    lines = []
    weighted = any(s.weight is not None for s in data.sources)
    tokenized = [c.tokenized for c in counted] or [None] * len(data.sources)  # the pre-flight's, beside the spec
    for s, found in zip(data.sources, tokenized, strict=True):
        fmt = s.detected
        what = fmt.describe() if fmt else "format detected on rank 0 (a Hub dataset)"
        loss = "every token" if s.train_on_prompt or (fmt and fmt.kind == TEXT) else "the answers"
        if fmt and fmt.kind in PROMPT_KINDS:
            loss = "the generated completions"
        share = next((f", {k} {getattr(s, k):g}" for k in ("fraction", "weight", "samples") if getattr(s, k)), "")
        if weighted and not share:
            share = ", weight 1 (unset)"
        held = f", eval on [{s.eval_split}]" if s.eval_split else ""
        lines.append(f"  dataset: {s.label}: {what}; loss on {loss}{share}{held}{_tokenized(found)}")
        lines += [f"    note: {n}" for n in (fmt.notes if fmt else ())]
    if data.test_split_size:
        lines.append(f"  eval: {data.test_split_size:.0%} of the training rows held out")
    if data.packing:
        strategy = packing_strategy or "bfd"
        how = PACKING.get(strategy, "{n} tokens a row").format(n=data.max_seq_len)
        lines.append(f"  packing: {strategy}, {how} (TRL's); the summary counts the packed rows")
    return lines


def _tokenized(found: dict[str, Any] | None) -> str:
    """What the pre-flight's tokenizing said about a source (preflight/tokens.py), for its plan line."""
    if not found:
        return ""
    if found.get("why_not"):
        return f"; not tokenized before launch ({found['why_not']})"
    part = "every row" if found["rows"] == found["of"] else f"{found['rows']:,} of {found['of']:,} rows"
    skipped = f"{found['skipped']:,} would be skipped" if found["skipped"] else "none skipped"
    return f"; tokenized here: {part}, {skipped}"


def image_lines(report: dict[str, Any]) -> list[str]:
    """A vision-language run's images, and the batches that ran the vision tower on the guard's dummy image."""
    images = report.get("images") or {}
    seen, dummies = images.get("train"), images.get("dummy_batches")
    lines = []
    if seen:
        lines.append(
            f"  data: {seen['image_sequences']} of {report['sequences']} training sequences have images "
            f"({seen['images']} images, {seen['image_tokens']} image tokens)"
        )
    if dummies:
        each = ", ".join(f"rank {i}: {n}" for i, n in enumerate(dummies))
        lines.append(f"  vision: batches without images that ran the tower on a dummy image: {each}")
    return lines


def _carved(report: dict[str, Any]) -> list[str]:
    """--test_split_size holds rows out of the mixed training rows after each source's line counted them: said, so
    that "200 rows" is not read as 200 trained on when 20 went to evaluation."""
    held = report.get("eval")
    if not held or any("eval" in s for s in report["sources"]):  # none, or each source's own eval split
        return []
    train, out = report["sequences"], held["sequences"]
    return [
        f"  data: {train} of those {train + out} sequences train, {out} are held out for evaluation (--test_split_size)"
    ]


def summary_lines(report: dict[str, Any] | None) -> list[str]:
    """The summary's data lines: formats and rows, skipped rows by reason, the share of tokens in the loss."""
    if not report:
        return []
    lines = []
    for s in report["sources"]:
        loss = {"all": "every token", "completions": "the generated completions"}.get(s["loss"], "the answers")
        used = f", {s['used']} used" if s.get("used", s["sequences"]) != s["sequences"] else ""
        what = "prompts" if s["kind"] in PROMPT_KINDS else "sequences"
        lines.append(
            f"  data: {s['source']}: {s['kind']}, {s['rows']} rows -> {s['sequences']} {what}{used}, loss on {loss}"
        )
        for reason, seen in s["skipped"].items():
            first = f"; the first: {seen['first']}" if seen.get("first") else ""
            lines.append(f"    skipped {seen['count']} row(s): {reason} ({', '.join(seen['rows'][:3])}{first})")
        clipped = s.get("clipped") or {}
        if clipped.get("count"):
            lines.append(
                f"    cut before tokenizing, {clipped['count']} row(s): far longer than max_seq_len, only the text "
                f"within its reach was rendered ({', '.join(clipped['rows'][:3])})"
            )
        for note, count in s.get("template_notes", {}).items():
            lines.append(f"    chat template, {count} sequence(s): {note}")
    lines += _carved(report)
    packed = report.get("packed")
    if packed:
        lines.append(
            f"  data: packed ({packed['strategy']}): {packed['sequences']} sequences -> {packed['rows']} rows of up "
            f"to {packed['max_seq_len']} tokens"
        )
    if report.get("loss_share") is not None:
        lines.append(f"  data: {report['loss_share']:.1%} of the {report['tokens']} training tokens are in the loss")
    lines += image_lines(report)
    held = report.get("eval")
    if held and held["tokens"]:
        share = held["loss_tokens"] / held["tokens"]
        lines.append(f"  eval: {held['sequences']} held-out sequences, loss on {share:.1%} of their tokens")
    return lines
