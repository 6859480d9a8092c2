"""The user's rewards called once before launch, on one row of the data, in a process of their own
(`python -m fsdp_tune.rewards.probe REQUEST.json`; preflight/rewards.py starts it): the launcher never imports the
user's code (it may import torch), and a reward that cannot be imported, raises, or returns what GRPO cannot use
(not one finite number or None per completion) is refused before any rank starts.

The call is GRPOTrainer's (_calculate_rewards): prompts, completions and completion_ids as keyword lists (two
made-up completions of the row's prompt, an empty one and a short one), the row's other columns repeated for each,
trainer_state None, log_extra and log_metric that keep nothing. Prints one JSON object, {written: problem or null},
on a line of its own after MARK.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import traceback

from fsdp_tune.rewards.guard import RewardError, problem
from fsdp_tune.rewards.resolve import RewardSpec

SAMPLES = ("", "42")
MARK = "fsdp-tune-probe: "  # the result's line (the user's code may print)


def completions_for(row: dict) -> tuple[list, list[list[int]]]:
    conversational = isinstance(row["prompt"], list)
    texts = [[{"role": "assistant", "content": t}] if conversational else t for t in SAMPLES]
    return texts, [[], [0]]


def call_once(func, row: dict):
    completions, ids = completions_for(row)
    n = len(completions)
    columns = {k: [v] * n for k, v in row.items() if k != "prompt"}
    kwargs = dict(
        prompts=[row["prompt"]] * n,
        completions=completions,
        completion_ids=ids,
        trainer_state=None,
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
        **columns,
    )
    values = func(**kwargs)
    return asyncio.run(values) if inspect.isawaitable(values) else values


def probe_one(spec: RewardSpec, row: dict) -> str | None:
    """What is wrong with the reward on this row, in one line naming the user's line that raised; None if nothing."""
    from fsdp_tune.rewards.load import load_function

    try:
        func = load_function(spec)
    except RewardError as e:
        return str(e)
    try:
        values = call_once(func, row)
    except Exception as e:  # noqa: BLE001 - the user's code
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "fsdp_tune" not in f.filename]
        at = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        return f"reward {spec.written} raised{at}: {type(e).__name__}: {' '.join(str(e).split())}"
    why = problem(values, len(SAMPLES))
    return f"reward {spec.written} {why}" if why else None


def main(path: str) -> None:
    request = json.loads(open(path).read())
    row = request["row"]
    out = {r["written"]: probe_one(RewardSpec(**r), row) for r in request["rewards"]}
    sys.stdout.write("\n" + MARK + json.dumps(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
