"""The data pre-flight for preference methods (preflight/data.py runs it in place of SFT's format checks when the
run's method is dpo, kto or reward): the format from the columns, what the method cannot use refused with file and
line, rows that cannot be trained on reported with file and line (and skipped on rank 0, counted in the summary).

    dpo, reward  pairs (preference, preference_implicit, ranked); unpaired rows are refused (PF075)
    kto          unpaired rows; pairs become two rows each (chosen desirable, rejected not), shuffled once with
                 the seed: TRL's own unpairing puts a whole map batch of desirable rows before the undesirable
                 ones, and KTO samples in order, so batches would be one-sided (PF076 says so, a note)

SFT data (messages, prompt/completion, ...) under a preference method is refused (PF075) naming its format.
"""

from __future__ import annotations

from fsdp_tune.config.methods import row_of
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.sources.formats import Format, FormatError, detect_format
from fsdp_tune.sources.preference import PAIRED, UNPAIRED, detect_preference


def detect(columns: list[str], rows: list[dict], source, method: str) -> Format:
    """The preference format of a source (FormatError when none matches: SFT data is named as such)."""
    try:
        return detect_preference(columns, rows, forced=source.format, column_map=source.column_map)
    except FormatError as e:
        try:
            sft = detect_format(columns, rows, forced=None, column_map={})
        except FormatError:
            raise e from None
        raise FormatError(
            f"this is supervised fine-tuning data ({sft.describe()}); --method {method} trains on preference data",
            "--method sft for this data; preference rows look like {prompt, chosen, rejected} (see `Preference "
            "tuning` in README.md)",
        ) from None


def method_findings(split: str, where: str, fmt: Format, method: str) -> list[Finding]:
    """What the method makes of the format: unpaired rows for a pairwise method refused, pairs for KTO unpaired."""
    unpaired = row_of(method).data == "unpaired"  # KTO trains on unpaired rows
    if not unpaired and fmt.kind == UNPAIRED:
        return [
            Finding(
                "PF075",
                Severity.ERROR,
                split,
                where,
                f"unpaired rows (prompt, completion, label) cannot train --method {method}: it compares a chosen "
                "with a rejected answer to the same prompt",
                "--method kto trains on unpaired rows; or give pairs: {prompt, chosen, rejected}",
            )
        ]
    if unpaired and fmt.kind in PAIRED:
        return [
            Finding(
                "PF076",
                Severity.NOTE,
                split,
                where,
                "pairs for KTO: each becomes two rows (the chosen answer desirable, the rejected one not), shuffled "
                "once with the seed, as KTOTrainer samples in order and its KL term pairs neighbours",
            )
        ]
    return []


def rows_per_usable(fmt: Format, method: str) -> int:
    """Rows trained on per usable row: a pair for DPO and reward, two rows for KTO from a pair (one from a row)."""
    return 2 if row_of(method).data == "unpaired" and fmt.kind in PAIRED else 1


def mixed_kinds(detected: list[Format]) -> str | None:
    """Why these sources cannot be one dataset (None when they can): text and conversations together."""
    kinds = {d.conversational for d in detected}
    if len(kinds) > 1:
        return "some sources are text and others conversations: TRL tokenizes a dataset one way"
    return None
