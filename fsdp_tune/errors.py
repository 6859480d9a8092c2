"""One error family for the whole tool; only `cli/common.py` turns these into output and exit codes."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    OK = 0
    TRAINING_FAILED = 1
    BAD_CONFIG = 2  # bad config, bad usage, or a failed pre-flight check
    INTERNAL_ERROR = 3  # a bug in fsdp-tune or a broken environment, not the user's input
    INTERRUPTED = 130  # SIGINT
    TERMINATED = 143  # SIGTERM


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    NOTE = "note"


@dataclass(frozen=True)
class Finding:
    """One problem with a launch: which rule, how bad, which key (as the user spelled it), where from."""

    rule: str
    severity: Severity
    key: str
    source: str
    message: str
    hint: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "severity": self.severity.value,
            "key": self.key,
            "source": self.source,
            "message": self.message,
            "hint": self.hint,
        }


class FsdpTuneError(Exception):
    """Base of the errors that are the user's to fix; never shown with a traceback unless --debug."""

    exit_code = ExitCode.BAD_CONFIG


class ConfigError(FsdpTuneError):
    """The configuration is invalid: carries every finding so the user fixes them in one round."""

    def __init__(self, subject: str, findings: list[Finding]):
        self.subject = subject
        self.findings = findings
        errors = [f for f in findings if f.severity is Severity.ERROR]
        super().__init__(
            f"{subject} is not a valid launch config ({len(errors)} problem{'s' if len(errors) != 1 else ''})"
        )


class UsageError(FsdpTuneError):
    """A command was called wrongly (a missing file, a flag without its value)."""

    def __init__(self, message: str, hint: str = ""):
        self.hint = hint
        super().__init__(message)


class PreflightError(FsdpTuneError):
    """The config is valid but this machine or these files cannot run it."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        n = len(findings)
        super().__init__(f"pre-flight checks failed ({n} problem{'s' if n != 1 else ''}); no process was started")


class LaunchError(FsdpTuneError):
    """Training started and failed; the report says which rank and why."""

    exit_code = ExitCode.TRAINING_FAILED

    def __init__(self, message: str, exit_code: int = ExitCode.TRAINING_FAILED):
        super().__init__(message)
        self.exit_code = exit_code
