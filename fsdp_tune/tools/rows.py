"""`fsdp-tune rows --config FILE [flags]`: the first training rows as rank 0 will train on them, token by token,
each marked in the loss or not (what axolotl's `preprocess --debug` shows).

Nothing is re-implemented: the config is decided from its data files as `train` decides it (decide/data.py
read_files: the files found, the format detected) and checked by `train`'s own pre-flight (preflight/checks.py
check_data: the run's tokenizer and chat template loaded without torch), and each row goes through rank 0's
encoder (sources/rows.py explained_row: converted, checked, cut to max_seq_len's reach, rendered, masked, cut at
max_seq_len). No torch, no launch; nothing is written.

On a terminal the tokens in the loss are green and the others dimmed; elsewhere (a pipe, a file) the text is plain
and each run of tokens in the loss stands between LOSS_OPEN and LOSS_CLOSE. Every piece of a row passes the console
door (output/console.py): an escape sequence in the data is shown escaped, never obeyed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fsdp_tune.errors import PreflightError, Severity, UsageError

LOSS_OPEN, LOSS_CLOSE = "[[", "]]"


@dataclass
class Shown:
    """One row as rank 0 encodes it: where it is, why it is skipped (or ""), its sequences as (token, in loss)."""

    where: str
    skipped: str = ""
    sequences: list[list[tuple[str, bool]]] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)


def first_rows(config: str | None, args: list[str], count: int) -> tuple[str, list[Shown]]:
    """(the first source's name and format, its first `count` rows of the training split as rank 0 encodes them).
    Refused (exit 2) with train's own findings when its pre-flight of the data finds an error."""
    from fsdp_tune.decide.data import read_files
    from fsdp_tune.decide.machine import probe
    from fsdp_tune.decide.rank import decide
    from fsdp_tune.preflight.checks import check_data
    from fsdp_tune.preflight.tokens import TokenCheck
    from fsdp_tune.validate import load

    cfg = load(config, args, launch=False).config
    files = read_files(cfg)  # read once: the spec is decided from them, the pre-flight checks them, rows shows them
    spec = decide(cfg, probe(), files=files)
    tokens = TokenCheck(spec)  # the run's tokenizer, loaded once: for the pre-flight and for the rows shown
    _, findings = check_data(spec, files, tokens)
    errors = [f for f in findings if f.severity is Severity.ERROR]
    if errors:
        raise PreflightError(errors)
    if spec.method.data != "sft":
        raise UsageError(
            f"--method {spec.method.name}: its rows are {spec.method.data} rows, which rows does not render",
            "fsdp-tune rows shows supervised fine-tuning's rows (the default --method sft)",
        )
    source = spec.data.sources[0]
    if not source.files or source.detected is None:
        raise UsageError(
            f"--dataset_name {source.path}: rows shows local data files (a Hub dataset is read on rank 0 only)",
            f"download it (hf download {source.path} --repo-type dataset) and pass its folder",
        )
    if tokens.encoder is None:
        raise UsageError(f"the run's tokenizer cannot be read here: {tokens.why_not}", "train loads it on the ranks")
    return _described(source), [_shown(where, row, source, tokens) for where, row in _rows(source, files[0], count)]


def _described(source) -> str:

    return f"{source.path} ({source.detected.describe()})"


def _rows(source, look, count: int) -> list:
    """The first `count` rows of the source's training split, as the pre-flight read them (`look`)."""
    from fsdp_tune.preflight.rows import sliced

    rows = [r for sample in look.samples[source.split] for r in sample.rows]
    return sliced(source.split, rows)[:count]


def _shown(where: str, row, source, tokens) -> Shown:
    from fsdp_tune.config.templates import rendering
    from fsdp_tune.sources.rows import REASONS, explained_row

    if not isinstance(row, dict):
        return Shown(where, "not a JSON object")
    with rendering():  # bounded in time and size, as the pre-flight renders (config/templates.py)
        code, detail, sequences = explained_row(
            row, source.detected, source.roles, tokens.encoder, source.train_on_prompt
        )
    if code:
        return Shown(where, f"{REASONS.get(code, code)}{f' ({detail})' if detail else ''}")
    tok = tokens.encoder.tokenizer
    pieces = [[(tok.decode([i]), bool(m)) for i, m in zip(s.input_ids, s.mask, strict=True)] for s in sequences]
    return Shown(where, "", pieces, [s.truncated for s in sequences])


def format_rows(described: str, shown: list[Shown], tty: bool) -> str:
    """The rows for people: a header a row, each sequence's text with its loss marked (colour on a terminal,
    LOSS_OPEN/LOSS_CLOSE elsewhere)."""
    from fsdp_tune.output.console import colour

    legend = "green: in the loss; dimmed: not" if tty else f"{LOSS_OPEN} {LOSS_CLOSE}: in the loss"
    out = [f"rows of {described}, as rank 0 trains on them ({legend})"]
    for row in shown:
        if row.skipped:
            out.append(f"\n{row.where}: skipped: {row.skipped}")
            continue
        for n, (pieces, cut) in enumerate(zip(row.sequences, row.truncated, strict=True), 1):
            part = f" sequence {n} of {len(row.sequences)}," if len(row.sequences) > 1 else ""
            loss = sum(in_loss for _, in_loss in pieces)
            note = ", cut at max_seq_len" if cut else ""
            out.append(f"\n{row.where}:{part} {len(pieces)} tokens, {loss} in the loss{note}")
            out.append(_marked(pieces, tty, colour))
    return "\n".join(out)


def _marked(pieces: list[tuple[str, bool]], tty: bool, colour) -> str:
    """The text of one sequence, its runs of tokens in the loss marked."""
    runs: list[tuple[str, bool]] = []
    for text, in_loss in pieces:
        if runs and runs[-1][1] == in_loss:
            runs[-1] = (runs[-1][0] + text, in_loss)
        else:
            runs.append((text, in_loss))
    if tty:
        return "".join(colour(text, fg="green" if in_loss else "bright_black") for text, in_loss in runs)
    return "".join(f"{LOSS_OPEN}{text}{LOSS_CLOSE}" if in_loss else text for text, in_loss in runs)
