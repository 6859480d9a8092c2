"""Pre-flight for the data (no `datasets`, no torch): the rows of every local source, as decide/datafiles.py read
them once and detected their format, checked: files that cannot be read, folders that mix kinds of files, columns
that match no format and rows of another format are refused; rows that will be skipped or whose turns are out of
order are reported with file and row; what it counts (usable rows, rows tokenized, images) is reported beside the
spec (`Counted`), never written into it. A Hub dataset is only checked for being reachable: rank 0 detects its
format (worker/data/prepare.py), with the same functions.
"""

from __future__ import annotations

from typing import Any

from fsdp_tune.config.methods import row_of
from fsdp_tune.decide import datafiles
from fsdp_tune.decide.datafiles import Counted, Look
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight import images as image_check
from fsdp_tune.preflight import prompts as prompt_check
from fsdp_tune.preflight import reach
from fsdp_tune.preflight.rows import COUNTED_ROWS, Kind, settle_kind, sliced
from fsdp_tune.preflight.rows import row_findings as _row_findings
from fsdp_tune.preflight.tokens import TokenCheck, token_findings
from fsdp_tune.preflight.tokens import listed as _listed
from fsdp_tune.sources import preference_check
from fsdp_tune.sources.data import dataset_cached
from fsdp_tune.sources.formats import REQUIRED, Format, FormatError, detect_format
from fsdp_tune.sources.mixture import Source, split_name
from fsdp_tune.sources.model import offline
from fsdp_tune.sources.preference_rows import canonical as preference_canonical
from fsdp_tune.sources.rowcheck import PREFLIGHT_REFUSES, Problem, check_row


def check_sources(
    sources: tuple[Source, ...], files: tuple[Look, ...], tokens: TokenCheck | None = None, method: str = "sft"
) -> tuple[tuple[Counted, ...], list[Finding]]:
    """(what was counted of each source, findings) for the spec's `sources` and the `files` they were decided
    from. `tokens`: tokenize their rows as rank 0 will (train's pre-flight; preflight/tokens.py); `method`: the
    training method (a preference method's data is checked by sources/preference_check.py)."""
    if not sources:
        hint = "--dataset_name data/train.jsonl (a file, a folder, a Hub name), or a `datasets:` list"
        return (), [Finding("PF010", Severity.ERROR, "--dataset_name", "command line", "no dataset given", hint)]
    counted: list[Counted] = []
    findings: list[Finding] = []
    for source, look in zip(sources, files, strict=True):
        one, found = check_source(source, look, tokens, method)
        counted.append(one)
        findings += [f for f in found if f not in findings]  # one file in two entries (train[:50%], train[50%:])
    mixable = not (row_of(method).preference or row_of(method).generates)
    if not mixable and (why := preference_check.mixed_kinds([s.detected for s in sources if s.detected])):
        findings.append(_error("PF077", "datasets", sources[0].path, why, "train on one kind of source"))
    return tuple(counted), findings


def settle(
    sources: tuple[Source, ...],
    text_field: str,
    peft_text_field: str | None,
    eval_wanted: bool,
    tokens: TokenCheck | None = None,
    method: str = "sft",
) -> tuple[tuple[Source, ...], tuple[Counted, ...], list[Finding]]:
    """The files of `sources` read (decide/datafiles.py), the sources settled from them, and checked: for a
    caller without a rank spec (`validate-config`'s files check, tests)."""
    files = datafiles.read(sources, text_field, peft_text_field, eval_wanted, method)
    settled = tuple(look.settled(s) for look, s in zip(files, sources, strict=True))
    counted, findings = check_sources(settled, files, tokens, method)
    return settled, counted, findings


def _hub_dataset(name: str) -> list[Finding]:
    """PF015: a Hub dataset that is not cached, with the Hub offline or not answering, would end rank 0 in
    `datasets`' retries and a traceback; the fix is a download where the Hub answers, into this machine's cache."""
    if dataset_cached(name):
        return []
    if offline("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        why = "the Hub is offline here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)"
    elif reason := reach.unreachable(f"{reach.hub_endpoint()}/api/datasets/{name}"):
        why = f"the Hub ({reach.hub_endpoint()}) cannot be reached: {reason}"
    else:
        return []
    message = f"{name} is a Hub dataset that is not in this machine's cache, and {why}"
    hint = (
        f"`hf download {name} --repo-type dataset` where the Hub answers (into this cache), or a local file or folder"
    )
    return [_error("PF015", "--dataset_name", "command line", message, hint)]


def _error(rule: str, key: str, where: str, message: str, hint: str = "") -> Finding:
    return Finding(rule, Severity.ERROR, key, where, message, hint)


def check_source(
    source: Source, look: Look, tokens: TokenCheck | None = None, method: str = "sft"
) -> tuple[Counted, list[Finding]]:
    """One source's rows as read and detected (`look`): which rows, which images, which tokens."""
    if not look.local:
        return Counted(), _hub_dataset(source.path)
    findings = list(look.findings)
    if look.fmt is None:  # the files or their format refused (look.findings say why)
        return Counted(), findings
    kind = prompt_check.KIND if row_of(method).generates else _preference(method) if row_of(method).preference else None
    if kind is not None:  # TRL's rows as they stand: prompts (preflight/prompts.py), preference pairs
        rows_checked, found = settle_kind(kind, source, look)
        return Counted(rows_checked=rows_checked), findings + found
    fmt, samples, first = look.fmt, look.samples, look.samples[source.split][0]
    tokenized: dict[str, Any] | None = None
    usable = images = None
    for s in look.splits:
        rows = sliced(s, [r for x in samples[s] for r in x.rows])
        findings += check_rows(split_name(s), rows, fmt, source.roles)
        seen, said = image_check.split_images(split_name(s), rows, fmt, source, first.columns, look.files)
        findings += said
        images = seen if s == source.split else images
        found = tokens.check(rows, fmt, source.roles, source.train_on_prompt) if tokens else None
        if found is not None:
            findings += token_findings(split_name(s), found, tokens.encoder.reach, tokens.max_seq_len)
        if s == source.split:
            tokenized = found.as_dict() if found is not None else {"why_not": tokens.why_not} if tokens else None
            every = found is not None and found.rows == found.of < COUNTED_ROWS
            usable = found.kept if every else _usable(rows, fmt, source.roles)
    return Counted(rows_checked=usable, tokenized=tokenized, images=images), findings


def _preference(method: str) -> Kind:
    """settle_source's format and row checks for a preference method (sources/preference_check.py)."""
    return Kind(
        said=lambda split, where, fmt: preference_check.method_findings(split, where, fmt, method),
        canonical=preference_canonical,
        per_row=lambda fmt: preference_check.rows_per_usable(fmt, method),
    )


def _usable(rows: list[tuple[str, Any]], fmt: Format, roles: dict[str, str]) -> int | None:
    """How many rows will be trained on (none skipped), for a split read whole and small enough to count twice;
    None for a large one (more rows than any step takes)."""
    if len(rows) >= COUNTED_ROWS:
        return None
    return sum(1 for _, r in rows if isinstance(r, dict) and not any(p.skips for p in check_row(r, fmt, roles)))


def check_rows(split: str, rows: list[tuple[str, Any]], fmt: Format, roles: dict[str, str]) -> list[Finding]:
    """Rows of another format (PF016, refused), rows that will be skipped (PF017), turns out of order (PF018)."""
    by_code: dict[str, list[str]] = {}
    first: dict[str, Problem] = {}  # the first row's problem of each kind, for its detail
    mixed: dict[str, list[str]] = {}
    required = [fmt.columns[f] for f in REQUIRED[fmt.kind]]
    for where, row in rows:
        if not isinstance(row, dict):
            by_code.setdefault("unreadable", []).append(where)
            first.setdefault("unreadable", Problem("unreadable", f"a row is {type(row).__name__}, not an object"))
            continue
        other = _other_format(row, fmt, required)
        if other:
            mixed.setdefault(other, []).append(where)
            continue
        for problem in check_row(row, fmt, roles):
            if problem.code in PREFLIGHT_REFUSES:
                continue  # refused with the images (PF079, preflight/images.py)
            by_code.setdefault(problem.code, []).append(where)
            first.setdefault(problem.code, problem)
    findings = [
        _error(
            "PF016",
            split,
            wheres[0],
            f"{len(wheres)} row(s) in {kind} format in this {fmt.kind} dataset ({_listed(wheres)})",
            "one format per file: split it, and list the parts as `datasets:` entries (each has its own format)",
        )
        for kind, wheres in mixed.items()
    ]
    return findings + _row_findings(split, by_code, first, len(rows) - sum(len(w) for w in mixed.values()))


def _other_format(row: dict, fmt: Format, required: list[str]) -> str | None:
    """The format of a row that lacks this dataset's columns but is whole in another one (JSON lines differ)."""
    if all(c in row for c in required):
        return None
    try:
        other = detect_format(row.keys(), [row])
    except FormatError:
        return None
    return other.kind if other.kind != fmt.kind else None
