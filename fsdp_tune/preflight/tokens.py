"""The rows tokenized on the launcher, before launch (#25: rows whose prompt alone fills max_seq_len were found
only on rank 0, and when every row was one of them the ranks crashed with an IndexError; #26: a row far
longer than max_seq_len was found by the time it took).

The tokenizer is the run's own, loaded without torch: transformers' class for a tokenizer.json (AutoTokenizer
would import torch through AutoConfig), from the model folder or the local Hub cache, or the builtin model's,
with the chat template the run applies (config/templates.py). `train` does this in its pre-flight (never
validate-config). Each row goes through what rank 0 does to it (sources/rows.py encode_row): converted,
checked, cut to max_seq_len's reach, rendered, tokenized, cut at max_seq_len. Up to ROWS rows a split (spread
evenly) within SECONDS for the whole run; the plan says how many were. Every row read is measured (cheap): rows
cut before tokenizing, or too large to tokenize at all, are named (PF071). Each render is bounded in time and size
(config/templates.py `rendering`): a template that loops or outgrows the bound is a PF070 error about the template.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fsdp_tune.config.templates import TemplateRefused, apply_template, rendering
from fsdp_tune.decide.spec import ModelSpec, RankSpec
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.sources.convert import to_trl
from fsdp_tune.sources.formats import Format

ROWS = 2_000  # rows tokenized a split, at most
SECONDS = 20.0  # for every split of every source together


def load_tokenizer(model: ModelSpec) -> tuple[Any | None, str]:
    """(the run's tokenizer, or None; why not)."""
    name = model.name_or_path
    try:
        from transformers import PreTrainedTokenizerFast

        if model.requested.startswith("builtin:"):  # its folder may not be built yet: the recipe's tokenizer then
            tok = _builtin(model.requested.removeprefix("builtin:"))
        else:
            revision = {"revision": model.revision} if model.revision else {}
            tok = PreTrainedTokenizerFast.from_pretrained(name, local_files_only=True, **revision)
    except Exception as e:  # noqa: BLE001 - no tokenizer.json, not cached, a class of its own: the ranks load it
        return None, f"its tokenizer does not load here without torch: {type(e).__name__}: {str(e)[:120]}"
    return apply_template(tok, model.chat_template), ""


def _builtin(name: str):
    from transformers import PreTrainedTokenizerFast

    from fsdp_tune.sources.builtin import PRESETS, target

    if target(name).is_dir():
        return PreTrainedTokenizerFast.from_pretrained(str(target(name)))
    from fsdp_tune.models.tiny import build_tokenizer  # the builtin model's own recipe, without the model

    return build_tokenizer(PRESETS[name]["vocab_size"])


@dataclass
class Tokenized:
    """What tokenizing one split's rows found: per skip reason the rows (file:line), and the size pass."""

    of: int  # rows read
    rows: int = 0  # rows tokenized
    kept: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason code -> where (tokenizing's reasons)
    other: int = 0  # rows skipped for rowcheck's reasons (PF017 names them)
    clipped: list[tuple[str, int]] = field(default_factory=list)  # (where, characters): cut before tokenizing
    too_large: list[tuple[str, int]] = field(default_factory=list)  # (where, characters): skipped
    fails: list[tuple[str, str]] = field(default_factory=list)  # (where, the error): rows that would stop rank 0

    def as_dict(self) -> dict[str, int]:
        return {"rows": self.rows, "of": self.of, "skipped": self.rows - self.kept}


class TokenCheck:
    """The run's tokenizer and rank 0's encoder, loaded on first use (Hub data alone needs neither), and the
    time left; `check` runs on one split's rows."""

    def __init__(self, spec: RankSpec):
        self.spec = spec
        self.max_seq_len = spec.data.max_seq_len
        self.why_not = ""  # why there is no tokenizer, once loading was tried
        self.deadline = 0.0
        self._encoder: Any = None
        self._loaded = False

    @property
    def encoder(self) -> Any:
        if not self._loaded:
            from fsdp_tune.sources.encode import Encoder

            self._loaded = True
            tokenizer, self.why_not = load_tokenizer(self.spec.model)
            if tokenizer is not None:
                self._encoder = Encoder.for_run(tokenizer, self.spec.data)
            self.deadline = time.monotonic() + SECONDS
        return self._encoder

    def check(self, rows: list[tuple[str, Any]], fmt: Format, roles: dict, train_all: bool) -> Tokenized | None:
        """None when there is no tokenizer."""
        if self.encoder is None:
            return None
        from fsdp_tune.sources.rows import encode_row

        found = Tokenized(of=len(rows))
        self.measure(rows, fmt, roles, found)
        step = max(1, math.ceil(len(rows) / ROWS))
        for where, row in rows[::step]:
            if time.monotonic() > self.deadline:
                break
            found.rows += 1
            if not isinstance(row, dict):
                found.other += 1
                continue
            try:
                with rendering():  # each render bounded in time and size (config/templates.py), whatever is left
                    skip, _ = encode_row(row, fmt, roles, self.encoder, train_all)
            except TemplateRefused as e:  # a finding about the template, not the row: one is enough
                found.fails.append((where, f"{e}"))
                break
            except Exception as e:  # noqa: BLE001 - what would stop rank 0 (--mask_fallback error, a template's own)
                found.fails.append((where, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"))
                continue
            if not skip:
                found.kept += 1
            elif skip in TOKENIZED_CODES:
                found.skipped.setdefault(skip, []).append(where)
            else:
                found.other += 1
        return found

    def measure(self, rows: list[tuple[str, Any]], fmt: Format, roles: dict, found: Tokenized) -> None:
        """Every row's size against max_seq_len's reach: the raw text first (cheap), converted when over it."""
        encoder = self.encoder
        reach = encoder.reach if encoder is not None else None
        if reach is None:
            return
        from fsdp_tune.sources.clip import row_chars

        for where, row in rows:
            if not isinstance(row, dict) or _raw_chars(row) <= reach.chars:
                continue
            try:
                size = row_chars(to_trl(row, fmt, roles))
            except (TypeError, AttributeError, KeyError, ValueError):
                continue  # rowcheck reports it
            if size > reach.chars and encoder.max_len is not None and not _uncuttable(row, fmt, encoder.keep_end):
                found.clipped.append((where, size))
            elif size > reach.bound:
                found.too_large.append((where, size))


TOKENIZED_CODES = ("template", "too-long", "too-large", "no-loss")


def _uncuttable(row: Mapping, fmt: Format, keep_end: bool) -> bool:
    """A conversation under keep_end is not cut (clip.py); it is bounded instead."""
    return keep_end and not (fmt.kind == "text" or (fmt.kind == "prompt_completion" and not fmt.conversational))


def _raw_chars(value: Any) -> int:
    """Characters in every string of a raw row (role names too: at least the text the row converts to)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_raw_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_raw_chars(v) for v in value)
    return 0


HINTS = {
    "too-long": "raise --max_seq_len, or shorten those prompts: an answer must start within max_seq_len tokens",
    "template": "fix those conversations' turns, or choose another --chat_template_format",
    "too-large": "split those rows into rows of about max_seq_len tokens, or shorten them",
    "no-loss": "check the chat template (--chat_template_format): it renders no answer token",
}
LISTED = 5  # rows named in one finding


def token_findings(split: str, found: Tokenized, reach: Any, max_seq_len: int) -> list[Finding]:
    """PF070: rows tokenizing skips (an error when no row is left and every row was tokenized); PF071: rows
    cut before tokenizing (a note) or too large to tokenize (skipped)."""
    from fsdp_tune.sources.rows import TOKENIZED

    findings = _size_findings(split, found, reach, max_seq_len)
    if found.fails:
        where, error = found.fails[0]
        message = f"{len(found.fails)} row(s) would stop rank 0 ({listed([w for w, _ in found.fails])}): {error}"
        hint = "--mask_fallback split (the default) or locate" if "InconsistentTemplate" in error else HINTS["template"]
        if error.startswith("the chat template"):  # config/templates.py's bounds: the template, not the rows
            hint = "the model's chat template is at fault: fix it, or choose another --chat_template_format"
        findings.append(Finding("PF070", Severity.ERROR, split, where, message, hint))
    checked = "every row" if found.rows == found.of else f"{found.rows:,} of {found.of:,} rows (spread evenly)"
    if found.rows and not found.kept and not found.fails:
        counts = "; ".join(f"{len(w)}: {TOKENIZED[c]} ({listed(w)})" for c, w in found.skipped.items())
        other = f"; {found.other}: skipped before tokenizing (PF017)" if found.other else ""
        certain = found.rows == found.of
        worst = max(found.skipped, key=lambda c: len(found.skipped[c]), default="too-long")
        where = next(iter(found.skipped.values()), [split])[0]
        message = f"no row of the {split} split is left once tokenized ({checked} tokenized here): {counts}{other}"
        if not certain:
            message += "; rank 0 stops if none is left"
        severity = Severity.ERROR if certain else Severity.WARNING
        return findings + [Finding("PF070", severity, split, where, message, HINTS.get(worst, ""))]
    for code, wheres in found.skipped.items():
        message = (
            f"{len(wheres)} row(s) of {checked} tokenized here will be skipped: {TOKENIZED[code]} ({listed(wheres)})"
        )
        findings.append(Finding("PF070", Severity.WARNING, split, wheres[0], message, HINTS[code]))
    return findings


def _size_findings(split: str, found: Tokenized, reach: Any, max_seq_len: int) -> list[Finding]:
    from fsdp_tune.sources.clip import ROW_BOUND

    findings = []
    if found.clipped:
        where, size = found.clipped[0]
        message = (
            f"{len(found.clipped)} row(s) far longer than max_seq_len {max_seq_len} can reach ("
            f"{listed([w for w, _ in found.clipped])}; the first: {size:,} characters): only the text within "
            f"{reach.chars:,} characters is rendered and tokenized (the cut at max_seq_len keeps no more)"
        )
        findings.append(Finding("PF071", Severity.NOTE, split, where, message, ""))
    if found.too_large:
        where, size = found.too_large[0]
        message = (
            f"{len(found.too_large)} row(s) skipped, too large to tokenize ({listed([w for w, _ in found.too_large])}; "
            f"the first: {size:,} characters, over the per-row bound of {reach.bound:,}: {ROW_BOUND} x "
            "max_seq_len's worth); nothing cuts them (a conversation under keep_end, or packing that keeps every token)"
        )
        findings.append(Finding("PF071", Severity.WARNING, split, where, message, HINTS["too-large"]))
    return findings


def listed(wheres: list[str]) -> str:
    """'x.jsonl:4, :9, :17 and 3 more': the file once, then the lines."""
    prefix = wheres[0].rsplit(":", 1)[0] + ":" if ":" in wheres[0] else None
    shown = [
        w if i == 0 or not prefix or not w.startswith(prefix) else ":" + w[len(prefix) :]
        for i, w in enumerate(wheres[:LISTED])
    ]
    more = f" and {len(wheres) - LISTED} more" if len(wheres) > LISTED else ""
    return ", ".join(shown) + more
