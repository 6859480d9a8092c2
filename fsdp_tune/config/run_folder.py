"""The run's folder and its resume point, as the config asks for them: one answer each, read by every command
(the rank spec's output_dir, the pre-flight, a resume's `latest`, `--emit`'s job, the scheduler refusals).

Plain functions of the typed config (no files read); where the checkpoint to resume is, is resolved once by
launch/train.py into RankSpec.resume_from_checkpoint.
"""

from __future__ import annotations

import os

from fsdp_tune.config.schema import RunConfig

DEFAULT_OUTPUT_DIR = "fsdp-tune-output"  # the one default: the rank spec, resume's `latest`, `--emit`'s job


def output_dir_as_given(cfg: RunConfig) -> str:
    """--output_dir as written, else fsdp-tune's default (relative: `--emit` puts it on the nodes' shared folder)."""
    return str(cfg.training.get("output_dir") or DEFAULT_OUTPUT_DIR)


def output_dir_origin(cfg: RunConfig) -> tuple[str, str]:
    """(the key as the user wrote it, where it came from) of --output_dir, for a message about its value."""
    out = cfg.origin("training.output_dir")
    return (out.key, out.source) if out else ("--output_dir", "command line")


def output_dir(cfg: RunConfig) -> str:
    """The run's output folder, absolute: the one answer the rank spec, the pre-flight and a resume's `latest`
    read (a run without --output_dir writes to ./fsdp-tune-output, and its plan says so)."""
    return os.path.abspath(output_dir_as_given(cfg))


def resume_request(cfg: RunConfig) -> str | None:
    """--resume_from_checkpoint as asked: "latest", or a checkpoint folder; None for a run from step 0. Whether a
    run resumes is this, read everywhere (launch/train.py resolves the point: RankSpec.resume_from_checkpoint)."""
    wanted = cfg.training.get("resume_from_checkpoint")
    return str(wanted) if wanted else None
