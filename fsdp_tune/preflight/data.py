"""Pre-flight for the data (no `datasets`, no torch): every local source is located and read, its format
detected and written into the rank spec; files that cannot be read, folders that mix kinds of files, columns
that match no format and rows of another format are refused; rows that will be skipped or whose turns are out
of order are reported with file and row. A Hub dataset is only checked for being reachable: rank 0 detects
its format (worker/data/prepare.py), with the same functions.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

from fsdp_tune.config.methods import row_of
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.preflight import images as image_check
from fsdp_tune.preflight import prompts as prompt_check
from fsdp_tune.preflight import reach
from fsdp_tune.preflight.rows import COUNTED_ROWS, DETECT_ROWS, Kind, settle_kind, sliced
from fsdp_tune.preflight.rows import row_findings as _row_findings
from fsdp_tune.preflight.tokens import TokenCheck, token_findings
from fsdp_tune.preflight.tokens import listed as _listed
from fsdp_tune.sources import preference_check
from fsdp_tune.sources.data import dataset_cached, locate
from fsdp_tune.sources.formats import AUTO, REQUIRED, Format, FormatError, detect_format, renders_to_text
from fsdp_tune.sources.mixture import Source, split_name
from fsdp_tune.sources.model import offline
from fsdp_tune.sources.preference_rows import canonical as preference_canonical
from fsdp_tune.sources.rowcheck import PREFLIGHT_REFUSES, Problem, check_row
from fsdp_tune.sources.sample import SCAN_SECONDS, Sample, read_sample


def settle(
    sources: tuple[Source, ...],
    text_field: str,
    peft_text_field: str | None,
    eval_wanted: bool,
    tokens: TokenCheck | None = None,
    method: str = "sft",
) -> tuple[tuple[Source, ...], list[Finding]]:
    """(the sources with what their files say, findings). `eval_wanted`: read each source's held-out split;
    `tokens`: tokenize their rows as rank 0 will (train's pre-flight; preflight/tokens.py); `method`: the
    training method (a preference method's data is checked by sources/preference_check.py)."""
    if not sources:
        hint = "--dataset_name data/train.jsonl (a file, a folder, a Hub name), or a `datasets:` list"
        return sources, [Finding("PF010", Severity.ERROR, "--dataset_name", "command line", "no dataset given", hint)]
    settled: list[Source] = []
    findings: list[Finding] = []
    for source in sources:
        one, found = settle_source(source, text_field, peft_text_field, eval_wanted, tokens, method)
        settled.append(one)
        findings += [f for f in found if f not in findings]  # one file in two entries (train[:50%], train[50%:])
    mixable = not (row_of(method).preference or row_of(method).generates)
    if not mixable and (why := preference_check.mixed_kinds([s.detected for s in settled if s.detected])):
        findings.append(_error("PF077", "datasets", settled[0].path, why, "train on one kind of source"))
    return tuple(settled), findings


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


def settle_source(
    source: Source,
    text_field: str,
    peft_text_field: str | None,
    eval_wanted: bool,
    tokens: TokenCheck | None = None,
    method: str = "sft",
) -> tuple[Source, list[Finding]]:
    """long because it is the pre-flight's story for one source, step by step: where, which splits, readable,
    consistent, which format, which rows."""
    located = locate(source)
    if not located.is_local:
        return source, _hub_dataset(source.path)
    if located.problem:
        rule = "PF019" if located.files else "PF010"
        return source, [_error(rule, "--dataset_name", source.path, located.problem, located.hint)]
    train = split_name(source.split)
    if train not in located.files:
        found = ", ".join(sorted(located.files)) or "none"
        message = f"{source.path}: no data files for the {train} split (splits found: {found})"
        hint = "--dataset_train_split NAME (or --splits), or name the files train.jsonl / test.jsonl"
        return source, [_error("PF010", "--dataset_name", source.path, message, hint)]
    eval_split = source.eval_split if eval_wanted else None
    findings: list[Finding] = []
    if eval_split and split_name(eval_split) not in located.files:
        message = f"{source.path}: evaluation needs a held-out split, and there is no {split_name(eval_split)} split"
        hint = "--dataset_test_split NAME, --test_split_size 0.1, or --eval_strategy no"
        findings.append(_error("PF013", "--eval_strategy", source.path, message, hint))
        eval_split = None
    splits = [s for s in (source.split, eval_split) if s]
    files = {split_name(s): located.files[split_name(s)] for s in splits}
    read = {name: [read_sample(f, located.loader or "json") for f in fs] for name, fs in files.items()}
    samples = {s: read[split_name(s)] for s in splits}  # train[:90%] and train[90%:] read the files once
    problems = [_error(p[0], split_name(s), p[1], p[2], p[3]) for s in splits for x in samples[s] if (p := x.problem)]
    problems += [_consistency(split_name(s), samples[s]) for s in splits if len(samples[s]) > 1]
    problems = [p for p in problems if p is not None]
    findings += [_unscanned(split_name(s), x) for s in splits for x in samples[s] if x.unscanned]
    empty = [s for s in splits if not any(x.rows or x.problem for x in samples[s])]
    problems += [
        _error("PF013", split_name(s), files[split_name(s)][0], f"the {split_name(s)} split is empty", "add rows")
        for s in empty
    ]
    if problems:
        return source, findings + problems
    first = samples[source.split][0]
    rows = [r for x in samples[source.split] for _, r in x.rows]
    kind = prompt_check.KIND if row_of(method).generates else _preference(method) if row_of(method).preference else None
    if kind is not None:  # TRL's rows as they stand: prompts (preflight/prompts.py), preference pairs
        settled, found = settle_kind(kind, source, splits, samples, located)
        return settled, findings + found
    try:
        fmt = detect(first.columns, [r for r in rows[:DETECT_ROWS] if isinstance(r, dict)], source, text_field)
    except FormatError as e:
        return source, findings + [_error("PF014", split_name(source.split), first.path, str(e), e.hint)]
    fmt, as_text = renders_to_text(fmt, first.columns, peft_text_field)
    train_all = source.train_on_prompt or as_text
    tokenized: dict[str, Any] | None = None
    usable = images = None
    for s in splits:
        rows = sliced(s, [r for x in samples[s] for r in x.rows])
        findings += check_rows(split_name(s), rows, fmt, source.roles)
        seen, said = image_check.split_images(split_name(s), rows, fmt, source, first.columns, files)
        findings += said
        images = seen if s == source.split else images
        found = tokens.check(rows, fmt, source.roles, train_all) if tokens else None
        if found is not None:
            findings += token_findings(split_name(s), found, tokens.encoder.reach, tokens.max_seq_len)
        if s == source.split:
            tokenized = found.as_dict() if found is not None else {"why_not": tokens.why_not} if tokens else None
            every = found is not None and found.rows == found.of < COUNTED_ROWS
            usable = found.kept if every else _usable(rows, fmt, source.roles)
    settled = replace(
        source,
        eval_split=eval_split,
        loader=located.loader,
        files=files,
        detected=fmt.as_dict(),
        train_on_prompt=train_all,
        rows_checked=usable,
        tokenized=tokenized,
        images=images,
    )
    return settled, findings


def _unscanned(split: str, sample: Sample) -> Finding:
    message = (
        f"{sample.path}: its lines were parsed up to line {sample.unscanned:,} within {SCAN_SECONDS:.0f} s; "
        "a malformed line past it is found by rank 0 only"
    )
    return Finding("PF072", Severity.NOTE, split, f"{sample.path}:{sample.unscanned}", message, "")


def _preference(method: str) -> Kind:
    """settle_source's format and row checks for a preference method (sources/preference_check.py)."""
    return Kind(
        detect=lambda columns, rows, source: preference_check.detect(columns, rows, source, method),
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


def detect(columns: list[str], rows: list[dict], source: Source, text_field: str) -> Format:
    """The dataset's format; JSON lines may differ row to row, so the format most rows have wins (the others
    are then refused as rows of another format, PF016)."""
    forced = source.format
    if forced == AUTO and rows:
        votes: Counter[str] = Counter()
        for row in rows:
            try:
                votes[detect_format(row.keys(), [row], column_map=source.column_map, text_field=text_field).kind] += 1
            except FormatError:
                continue
        forced = votes.most_common(1)[0][0] if len(votes) > 1 else AUTO
    return detect_format(columns, rows, forced=forced, column_map=source.column_map, text_field=text_field)


def _consistency(split: str, samples: list[Sample]) -> Finding | None:
    """#17: the files of one split must share their columns: `datasets` unifies them into one table."""
    first = samples[0]
    for other in samples[1:]:
        if set(other.columns) != set(first.columns) and other.rows:
            return _error(
                "PF019",
                split,
                other.path,
                f"its columns ({', '.join(other.columns)}) differ from {first.path}'s ({', '.join(first.columns)}); "
                "the files of one split are read as one table",
                "keep files of one format per split, or list each as its own `datasets:` entry",
            )
    return None


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
