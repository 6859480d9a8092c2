"""The one door a job file's text goes through: every value that reaches a job file is checked here, and every
file is written by a serializer (shell words by shlex.quote, YAML by yaml.safe_dump), never by pasting a value
into a template.

- `refuse_controls` / `check_job`: a line break, carriage return, escape, NUL or any other character
  fsdp_tune/printable.py escapes (C0, DEL, C1, U+2028/U+2029, which YAML readers take as line breaks, bidi
  overrides, an undecodable byte) in a value bound for a job file is
  refused before anything is written (PF096), naming the key the value came from. In a job file such a value ends
  a comment line and starts a command (SLURM), or starts a second YAML document (a second Kubernetes object).
- `shell_line`, `shell_default`: each word single-quoted as one word (shlex.quote), so `$(...)`, backticks, `;`
  and quotes in a path stay characters; an environment default is a single-quoted literal, never a word inside
  `"${NAME:-...}"` (where bash would expand it).
- `yaml_file`: comment lines, then exactly one document dumped by yaml.safe_dump and read back as one.
- `comment`: a header line; any control character left (a Job built without `check_job`) is shown escaped.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

import yaml

from fsdp_tune.errors import Finding, PreflightError, Severity
from fsdp_tune.printable import has_controls, printable

RULE = "PF096"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # an environment variable's name, as bash takes it in `export`


def shown(value: str) -> str:
    """`value` with each control character written as an escape (\\x0a, \\x1b, \\u2028: fsdp_tune/printable.py),
    safe to print and to put in a comment."""
    return printable(value, keep="")


def finding(key: str, source: str, value: str) -> Finding | None:
    """PF096 for a value holding a control character, else None."""
    if not has_controls(value):
        return None
    at = next(i for i, c in enumerate(value) if has_controls(c))
    char = shown(value[at])
    return Finding(
        RULE,
        Severity.ERROR,
        key,
        source,
        f"{shown(value)} holds a control character ({char} at position {at}): in a job file it would end "
        "the line and make the rest a command or a second document",
        f"give {key} a value without line breaks, escapes or other control characters",
    )


def refuse_controls(values: Iterable[tuple[str, str, str | None]]) -> None:
    """Every (key, source, value) bound for a job file checked; PreflightError with one PF096 a bad value."""
    found = [f for key, source, value in values if value is not None for f in [finding(key, source, value)] if f]
    if found:
        raise PreflightError(found)


def flag_values(argv: Iterable[str], source: str = "command line") -> list[tuple[str, str, str]]:
    """(key, source, word) for each word of a command line: the key is the flag a word belongs to (the flag
    itself for `--flag` and `--flag=value`), `argument` before any flag."""
    out, key = [], "argument"
    for word in argv:
        if word.startswith("--"):
            key = word.partition("=")[0]
        out.append((key, source, word))
    return out


def check_job(job) -> None:
    """Every value a Job puts in its file, checked by `refuse_controls`; `job.origins` names where the user's
    values came from (field -> (key, source)), the rest are keyed by the flag or field they are."""

    def origin(name: str, key: str, source: str = "command line") -> tuple[str, str]:
        return job.origins.get(name, (key, source))

    values = [
        (*origin("output_dir", "--output_dir"), job.output_dir),
        (*origin("shared", "--shared"), job.shared),
        (*origin("shared", "--shared"), job.mount),
        (*origin("config", "--config"), job.config),
        (*origin("image", "--image"), job.image),
        (*origin("workdir", "the folder emitted from", "cwd"), job.workdir),
        (*origin("name", "the job's name", "from output_dir"), job.name),
    ]
    values += [(*origin("env", f"environment {k}", "from --shared"), v) for k, v in job.env.items()]
    values += [(*job.origins.get(key.lstrip("-"), (key, src)), word) for key, src, word in flag_values(job.args)]
    values += [(*origin(f"data {path}", "data path", "the config"), path) for path in job.data_paths]
    values += [("the plan", "fsdp-tune", fact) for fact in job.facts]
    refuse_controls(values)
    bad_names = [k for k in job.env if not NAME.match(k)]
    if bad_names:  # our own names only (HF_HOME): a bug, not the user's
        raise ValueError(f"not an environment variable name: {bad_names}")


def shell_line(words: Iterable[str]) -> str:
    """One command line, each word quoted as one word."""
    return " ".join(shlex.quote(w) for w in words)


def shell_default(name: str, value: str) -> str:
    """`export NAME`, holding the environment's NAME when set and not empty, else `value` as a literal."""
    if not NAME.match(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    return f'[ -n "${{{name}:-}}" ] || {name}={shlex.quote(value)}; export {name}'


def comment(text: str, mark: str = "#") -> str:
    return f"{mark} {shown(text)}".rstrip() + "\n"


def yaml_file(header: Iterable[str], doc: Mapping) -> str:
    """The header as comment lines, then `doc` as exactly one YAML document (read back to make sure)."""
    body = yaml.safe_dump(dict(doc), sort_keys=False, width=1000)
    text = "".join(comment(line) for line in header) + body
    docs = list(yaml.safe_load_all(text))
    if len(docs) != 1 or docs[0] != doc:  # the dumper's promise, kept by the door: our bug if not
        raise ValueError("the job file does not read back as the one document written")
    return text
