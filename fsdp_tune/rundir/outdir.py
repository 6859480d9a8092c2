"""What the output folder holds before a run starts, and what the run may do with it.

A folder is empty, a run's (fsdp-tune's files, or checkpoints and an adapter of another trainer), or
someone's files that are not a run's (a README.md, a loss.png). A run starts in an empty folder; it
continues a run's folder with --resume_from_checkpoint; --overwrite_output_dir moves a previous run aside,
to OUTPUT_DIR.previous-ID beside it (never deleted: a fresh folder the old checkpoints cannot leak from),
and only a run: a folder holding anything a run does not write (a git work tree, sources, a home
directory, the current directory) is never moved, whatever the flags (#26: `train --output_dir .` in a
checkout moved .git and the sources). Anything else is refused before a process starts. A manifest
replayed into the folder it came from would write over the run it records: refused too.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rundir.checkpoints import folder_run_id, list_checkpoints
from fsdp_tune.runfiles import (
    ADAPTER_WEIGHTS,
    LOCK_NAME,
    LOG_DIR,
    MANIFEST_NAME,
    PREVIOUS_RUN_INFIX,
    RESOLVED_NAME,
    SUMMARY_NAME,
    links_in,
)

# The rank specs other machines of a multi-node run write into the shared folder while node 0 looks at it:
# each written whole (runfiles.write_atomic: a ".NAME.XXXX.tmp" first, then renamed), so either name may be there
_OTHER_NODES = rf"\.?node[1-9]\d*-{re.escape(RESOLVED_NAME)}(\..+\.tmp)?"
# left where they are: the lock (the new run holds it) and other machines' rank specs; logs alone make no run
_TRANSIENT = re.compile(
    rf"^(\.fsdp-tune-probe-.*|{re.escape(LOCK_NAME)}|node0-{re.escape(RESOLVED_NAME)}|{_OTHER_NODES}|{LOG_DIR})$"
)
_RUN_EVIDENCE = (MANIFEST_NAME, RESOLVED_NAME, SUMMARY_NAME, ADAPTER_WEIGHTS, "trainer_state.json")
# what a run writes into its folder (fsdp-tune, the Trainer, PEFT's model card, tokenizers, trackers): anything
# else in a run's folder is someone's, and --overwrite_output_dir does not move it
_RUN_ENTRY = re.compile(
    r"^(checkpoint-\d+|logs|runs|fsdp_tune_data|fsdp_tune_[a-z]+\.json|fsdp_tune_(complete|stop)|metrics(\.previous)?\.jsonl"
    r"|loss\.png|README\.md|adapter_(model\.safetensors|model\.bin|config\.json)|tokenizer(_config)?\.json|tokenizer\.model"
    r"|special_tokens_map\.json|added_tokens\.json|vocab\.(json|txt)|merges\.txt|chat_template\.(jinja|json)|config\.json"
    r"|generation_config\.json|(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)(\.index\.json)?|training_args\.bin"
    r"|trainer_state\.json|(all|train|eval)_results\.json|\.fsdp_tune_\w+\.json\.\w+\.tmp)$"
)


@dataclass(frozen=True)
class Folder:
    path: Path
    kind: str  # "absent" | "empty" | "run" | "foreign"
    run_id: str | None = None  # the run it holds, from its manifest
    evidence: list[str] = field(default_factory=list)  # what makes it a run's, or the files that are not a run's
    others: list[str] = field(default_factory=list)  # what it holds that no run writes (never moved aside)


def inspect(output_dir: str | Path) -> Folder:
    out = Path(output_dir)
    if not out.is_dir():
        return Folder(out, "absent")
    links = {p.relative_to(out).as_posix() for p in links_in(out)}  # a link anywhere makes it not empty (#26)
    entries = sorted({p.name for p in out.iterdir() if not _TRANSIENT.match(p.name)} | links)
    if not entries:
        return Folder(out, "empty")
    evidence = [n for n in _RUN_EVIDENCE if n in entries] + [c.path.name for c in list_checkpoints(out)]
    if evidence:
        others = [n for n in entries if not _RUN_ENTRY.match(n) or n in links]
        return Folder(out, "run", folder_run_id(out), evidence, others)
    return Folder(out, "foreign", None, entries, entries)


def aside_path(folder: Folder) -> Path:
    """Where --overwrite_output_dir moves the folder's content: a new sibling, never an existing one."""
    out = folder.path
    stamp = folder.run_id or time.strftime("%Y%m%d-%H%M%S", time.localtime(out.stat().st_mtime))
    target = out.with_name(f"{out.name}{PREVIOUS_RUN_INFIX}{stamp}")
    n = 2
    while target.exists():
        target = out.with_name(f"{out.name}{PREVIOUS_RUN_INFIX}{stamp}-{n}")
        n += 1
    return target


def move_aside(folder: Folder) -> Path:
    """Move everything but the lock and other machines' rank specs to aside_path(); returns that folder."""
    target = aside_path(folder)
    target.mkdir()
    for entry in sorted(folder.path.iterdir()):
        if entry.name == LOCK_NAME or re.fullmatch(_OTHER_NODES, entry.name):
            continue
        os.rename(entry, target / entry.name)
    return target


def findings(folder: Folder, *, resume: bool, overwrite: bool) -> list[Finding]:
    """PF031 a previous run, PF033 files that are not a run's, PF038 nowhere to move them aside."""
    if folder.kind in ("absent", "empty"):
        return []
    shown = ", ".join(folder.evidence[:4]) + (", ..." if len(folder.evidence) > 4 else "")
    if overwrite and not resume:
        return _aside_findings(folder)
    if folder.kind == "foreign":
        return [
            _err(
                "PF033",
                f"{folder.path} holds files that are not a run's ({shown}): a run would write over them",
                "choose an empty or new --output_dir (--overwrite_output_dir moves aside a previous run only)",
            )
        ]
    if resume:
        return []
    return [
        _err(
            "PF031",
            f"{folder.path} holds a previous run ({shown})",
            "--resume_from_checkpoint latest to continue it, or --overwrite_output_dir to start over (the "
            f"previous run is moved aside to {folder.path.name}{PREVIOUS_RUN_INFIX}..., nothing is deleted), or "
            "another --output_dir",
        )
    ]


def _special_place(where: Path) -> str | None:
    """What `where` is, when it is a place --overwrite_output_dir must never empty."""
    cwd = Path.cwd().resolve()
    if where == Path(where.anchor):
        return "the root of the file system"
    if where == Path.home().resolve():
        return "your home directory"
    if where == cwd:
        return "the current directory"
    if where in cwd.parents:
        return f"a folder above the current directory ({cwd})"
    if (where / ".git").exists():
        return "a git work tree (it holds .git)"
    return None


def no_run_folder(out: Path) -> Finding | None:
    """PF030 for the root of the file system, found from the path alone, before anything walks the folder
    (links_in, inspect): walking `/` for links would read the whole file system before refusing it."""
    where = out.resolve()
    if where != Path(where.anchor):
        return None
    return _err(
        "PF030",
        f"--output_dir {out} is the root of the file system: a run writes into a folder of its own",
        "choose a new folder for the run, e.g. --output_dir runs/my-run",
    )


def _never_moved(folder: Folder) -> Finding | None:
    """PF062 for the places --overwrite_output_dir never empties, PF033 for a folder with files no run writes."""
    special = _special_place(folder.path.resolve())
    if special:
        return _err(
            "PF062",
            f"--overwrite_output_dir would move what {folder.path} holds aside, and it is {special}",
            "choose a new folder for the run, e.g. --output_dir runs/my-run",
        )
    if not folder.others:
        return None
    shown = ", ".join(folder.others[:4]) + (", ..." if len(folder.others) > 4 else "")
    what = "holds files that are not a run's" if folder.kind == "foreign" else "holds a run, and besides it"
    return _err(
        "PF033",
        f"{folder.path} {what} {shown}: --overwrite_output_dir moves aside a previous run only, never someone's files",
        "choose an empty or new --output_dir" + (", or move those files out yourself" if folder.kind == "run" else ""),
    )


def _aside_findings(folder: Folder) -> list[Finding]:
    refused = _never_moved(folder)
    if refused:
        return [refused]
    parent = folder.path.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        problem = f"{parent} cannot be written"
    elif os.stat(parent).st_dev != os.stat(folder.path).st_dev:
        problem = f"{folder.path} is a mount point (its content cannot be moved beside it)"
    else:
        return []
    return [
        _err(
            "PF038",
            f"--overwrite_output_dir moves what {folder.path} holds aside, beside it, but {problem}",
            "choose another --output_dir, or move the previous run away yourself",
        )
    ]


def replay_findings(config_path: str | None, fmt: str | None, output_dir: str, resume: bool) -> list[Finding]:
    """PF035: `train --config RUN/fsdp_tune_run.json` without a new --output_dir would write over RUN."""
    if fmt != "manifest" or not config_path or resume:
        return []
    source = Path(config_path).resolve().parent
    if source != Path(output_dir).resolve():
        return []
    return [
        _err(
            "PF035",
            f"{config_path} is the manifest of the run in {source}: replaying it there would write over that run's "
            "adapter, checkpoints and manifest",
            f"--output_dir {source.name}-replay (a new folder), or --resume_from_checkpoint latest to continue it",
        )
    ]


def links_finding(out: Path, links: list[Path]) -> Finding:
    """PF061: a link inside the output folder would take the run's writes elsewhere (the lock truncated, a rank's
    log appended to whatever file it names)."""
    shown = ", ".join(f"{p.relative_to(out)} -> {os.readlink(p)}" for p in links[:3]) + (
        ", ..." if len(links) > 3 else ""
    )
    return _err(
        "PF061",
        f"{out} holds {len(links)} link(s) ({shown}): the run's files (fsdp_tune.lock, logs/rank-K.log, the manifest, "
        "checkpoints) are written inside the folder, and through a link they would land somewhere else",
        f"remove the link(s) (rm {links[0]}), or choose another --output_dir",
    )


def _err(rule: str, message: str, hint: str) -> Finding:
    return Finding(rule, Severity.ERROR, "--output_dir", "command line", message, hint)
