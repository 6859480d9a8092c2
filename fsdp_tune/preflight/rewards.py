"""A generating method's rewards (GRPO, RLOO), checked by `train` before any rank starts (after the data's pre-flight,
which found the prompts): a built-in's columns and package, and the user's functions imported and called on one row
of the data in a process of their own (rewards/probe.py). No torch here; the user's code runs in the probe because
the user named it.

    PF087  a built-in reads a column the data lacks, only takes conversational prompts, or needs a package that
           is not installed
    PF088  the user's reward cannot be imported, raises, or returns what GRPO cannot use (an error); no local row to
           call it on, a Hub dataset (a note: the ranks check every result)
    PF089  vLLM asked for and not installed (on a CPU run FT137 refuses it)
    PF097  a reward model's folder (or a reward run's base) needs its own Python code and trust_remote_code is off:
           the ranks' loader door would refuse it after launch (worker/loading/door.py)
(PF086, the data's notes, is preflight/prompts.py's.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from fsdp_tune.decide.datafiles import Look
from fsdp_tune.decide.spec import RankSpec, RewardSpec
from fsdp_tune.errors import Finding, Severity
from fsdp_tune.rewards.builtin import BUILTINS
from fsdp_tune.rewards.probe import MARK
from fsdp_tune.runfiles import RESOLVED_NAME

PROBE_SECONDS = 120
KEY = "--reward_funcs"


def check_rewards(spec: RankSpec, files: tuple[Look, ...]) -> list[Finding]:
    """`files`: the data files as decide() read them once (decide/datafiles.py), the spec's sources in order: the
    rewards are called on the first usable row of those samples."""
    from fsdp_tune.preflight.prompts import first_row

    if spec.generating is None:
        return []
    findings = _generation(spec) + [f for r in spec.generating.rewards for f in _code(r, spec)]
    found = next((f for s, look in zip(spec.data.sources, files, strict=True) if (f := first_row(s, look))), None)
    row, where = found or (None, spec.data.dataset_name)
    findings += [f for r in spec.generating.rewards if r.kind == "builtin" for f in _builtin(r, row, where)]
    users = [r for r in spec.generating.rewards if r.kind == "python"]
    if users and row is None:
        message = "no local row to call the rewards on before launch (a Hub dataset): the ranks check every result"
        return [*findings, Finding("PF088", Severity.NOTE, KEY, "command line", message, "")]
    if users:
        findings += _probe(users, row, where)
    return findings


def _code(reward: RewardSpec, spec: RankSpec) -> list[Finding]:
    """PF097: what the ranks open for a reward model (its folder: the tokenizer, the classifier; a reward run's base)
    asked of the same loader rules they apply, before launch: a folder needing code without the opt-in."""
    if reward.kind not in ("reward_model", "reward_run") or spec.model.trust_remote_code:
        return []
    from fsdp_tune.config.folders import FolderRefused, read_json
    from fsdp_tune.sources.model import local_folder, model_facts
    from fsdp_tune.sources.modelcheck import code_asked

    names = [reward.target]
    if reward.kind == "reward_run":
        try:
            names.append(read_json(Path(reward.target, RESOLVED_NAME))["spec"]["model"]["name_or_path"])
        except (FolderRefused, KeyError, TypeError):
            pass  # the ranks say what is wrong with the run's folder
    for name in names:
        folder = local_folder(str(name))
        asked = code_asked(folder, model_facts(str(name))) if folder is not None else []
        if asked:
            message = f"{folder / asked[0]}: the reward model needs its own Python code (auto_map), run only on opt-in"
            hint = (
                "read the folder's .py files, then pass --trust_remote_code true (it applies to every model of the run)"
            )
            return [Finding("PF097", Severity.ERROR, KEY, reward.written, message, hint)]
    return []


def _generation(spec: RankSpec) -> list[Finding]:
    if spec.generating.generation != "vllm" or spec.device == "cpu":  # on CPU: FT137
        return []
    if importlib.util.find_spec("vllm") is None:
        message = "vllm is not installed"
        return [Finding("PF089", Severity.ERROR, "--use_vllm", "command line", message, "pip install vllm")]
    return []


def _builtin(reward: RewardSpec, row: dict | None, where: str) -> list[Finding]:
    facts = BUILTINS[reward.target]
    found = []
    if facts.package and importlib.util.find_spec(facts.package) is None:
        message = f"{reward.written} needs the {facts.package} package, which is not installed"
        found.append(Finding("PF087", Severity.ERROR, KEY, "command line", message, f"pip install {facts.package}"))
    if row is None:
        return found
    missing = [c for c in facts.columns if c not in row]
    if missing:
        has = ", ".join(sorted(row))
        message = f"{reward.written} reads the column(s) {', '.join(missing)}, which the data lacks (it has: {has})"
        hint = f"add a {missing[0]!r} column, or write a reward that reads yours (my_rewards.py:fn)"
        found.append(Finding("PF087", Severity.ERROR, KEY, where, message, hint))
    if facts.conversational and not isinstance(row.get("prompt"), list):
        message = f"{reward.written} reads conversational completions (completion[0]['content']); the prompts are text"
        found.append(Finding("PF087", Severity.ERROR, KEY, where, message, "conversational prompts, or another reward"))
    return found


def _probe(rewards: list[RewardSpec], row: dict, where: str) -> list[Finding]:
    request = {"rewards": [asdict(r) for r in rewards], "row": row}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f, default=str)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fsdp_tune.rewards.probe", f.name],
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    except subprocess.TimeoutExpired:
        message = (
            f"calling the rewards on one row took over {PROBE_SECONDS} s ({', '.join(r.written for r in rewards)})"
        )
        return [
            Finding("PF088", Severity.ERROR, KEY, where, message, "check what the reward does at import and per call")
        ]
    finally:
        os.unlink(f.name)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-1:]) or f"exit {done.returncode}"
        message = f"calling the rewards on one row failed before any result: {tail}"
        return [Finding("PF088", Severity.ERROR, KEY, where, message, "run the reward in Python on one row")]
    results = json.loads(lines[-1].removeprefix(MARK))
    return [
        Finding("PF088", Severity.ERROR, KEY, where, f"{why} (called on the first row of the data)", _hint(why))
        for why in results.values()
        if why
    ]


def _hint(why: str) -> str:
    if "values for" in why:
        return "return one value per completion: [score(c) for c in completions]"
    if "NaN" in why or "nan" in why:
        return "return None for a completion the reward does not apply to"
    if "importing" in why:
        return "run `python -c 'import ...'` on the file to see the error"
    return "fix the function; it takes (prompts, completions, completion_ids, **columns) and returns a list"
