"""Entry point of one rank: `python -m fsdp_tune.worker OUTPUT_DIR/fsdp_tune_resolved.json` (torchrun runs it)."""

from __future__ import annotations

import sys
import time

STARTED = time.time()  # before torch is imported: time-to-first-step includes the imports

from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402


@record
def main() -> None:
    from fsdp_tune.worker.run import run

    run(sys.argv[1], started=STARTED)


if __name__ == "__main__":
    main()
