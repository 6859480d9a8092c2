"""Run several resolved rank specs one after another in one torchrun launch (one process group, one start-up):
how tests/dist/test_sharded_loading.py compares both loading paths on several models for the price of one launch.

torchrun --standalone --nproc_per_node 2 -m tests.dist.recipes_in_one_group RESOLVED.json [RESOLVED.json ...]
(from the checkout's root, so that fsdp_tune is this checkout's)
Each spec runs the whole rank recipe (fsdp_tune/worker/recipe.py run) as `fsdp-tune train` would have it run.
"""

from __future__ import annotations

import gc
import os
import sys
import time


def main(paths: list[str]) -> None:
    from accelerate.state import AcceleratorState, GradientState

    from fsdp_tune.worker.recipe import run

    for path in paths:
        run(path, started=time.time())
        # each recipe builds its own Trainer; accelerate keeps one process-wide state, the process group stays
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
        gc.collect()


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as fsdp_tune/worker/__main__.py: no native teardown after the work is done
