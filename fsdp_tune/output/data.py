"""Text for people about the data (run.py's lines for it, kept here to keep run.py small): what the
plan says each source is and trains on, and what the summary says was skipped and how much was in the loss."""

from __future__ import annotations

from typing import Any

from fsdp_tune.launch.spec import DataSpec
from fsdp_tune.sources.formats import TEXT, Format


def plan_lines(data: DataSpec) -> list[str]:
    """One line per source: its format (detected here, or on rank 0 for a Hub dataset), what is in the loss,
    its share of a mixture and its held-out split."""
    lines = []
    for s in data.sources:
        fmt = Format.from_dict(s.detected) if s.detected else None
        what = fmt.describe() if fmt else "format detected on rank 0 (a Hub dataset)"
        loss = "every token" if s.train_on_prompt or (fmt and fmt.kind == TEXT) else "the answers"
        share = next((f", {k} {getattr(s, k):g}" for k in ("fraction", "weight", "samples") if getattr(s, k)), "")
        held = f", eval on [{s.eval_split}]" if s.eval_split else ""
        lines.append(f"  dataset: {s.label}: {what}; loss on {loss}{share}{held}")
        lines += [f"    note: {n}" for n in (fmt.notes if fmt else ())]
    if data.test_split_size:
        lines.append(f"  eval: {data.test_split_size:.0%} of the training rows held out")
    return lines


def summary_lines(report: dict[str, Any] | None) -> list[str]:
    """The summary's data lines: formats and rows, skipped rows by reason, the share of tokens in the loss."""
    if not report:
        return []
    lines = []
    for s in report["sources"]:
        loss = "every token" if s["loss"] == "all" else "the answers"
        used = f", {s['used']} used" if s.get("used", s["sequences"]) != s["sequences"] else ""
        lines.append(
            f"  data: {s['source']}: {s['kind']}, {s['rows']} rows -> {s['sequences']} sequences{used}, loss on {loss}"
        )
        for reason, seen in s["skipped"].items():
            lines.append(f"    skipped {seen['count']} row(s): {reason} ({', '.join(seen['rows'][:3])})")
        for note, count in s.get("template_notes", {}).items():
            lines.append(f"    chat template, {count} sequence(s): {note}")
    if report.get("loss_share") is not None:
        lines.append(f"  data: {report['loss_share']:.1%} of the {report['tokens']} training tokens are in the loss")
    held = report.get("eval")
    if held and held["tokens"]:
        share = held["loss_tokens"] / held["tokens"]
        lines.append(f"  eval: {held['sequences']} held-out sequences, loss on {share:.1%} of their tokens")
    return lines
