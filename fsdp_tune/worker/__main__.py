"""Entry point of one rank: `python -m fsdp_tune.worker OUTPUT_DIR/fsdp_tune_resolved.json` (torchrun runs it)."""

from __future__ import annotations

import sys
import time

STARTED = time.time()  # before torch is imported: time-to-first-step includes the imports

from fsdp_tune.worker.errors import describe  # noqa: E402
from fsdp_tune.worker.logs import console, setup_from_spec  # noqa: E402
from fsdp_tune.worker.training import signals  # noqa: E402

signals.current()  # a stop request during start-up (imports, loading) is kept for the first step end
if len(sys.argv) > 1:
    setup_from_spec(sys.argv[1])  # before torch: what the imports print goes to the rank log too

from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402


@record
def main() -> None:
    from fsdp_tune.worker.recipe import run  # torch, transformers, TRL: after the rank log is set up

    try:
        try:
            run(sys.argv[1], started=STARTED)
        except (Exception, KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as err:  # noqa: BLE001 - torch.distributed.checkpoint's CheckpointException is one
            # @record writes the error file (the failure report's root cause) for Exceptions only
            raise RuntimeError(describe(err, sys.argv[1])) from err
    except Exception:
        import traceback

        console().show_error(traceback.format_exc())  # the launcher's failure report tells the console
        raise


def _exit_without_native_teardown() -> None:
    """A finished rank ends here. Python's exit handlers run (trackers flush, logs close), then the process
    exits without the interpreter's native teardown: a native thread pool still alive at that point (Arrow's,
    seen in CI) can abort with "terminate called without an active exception" after all the work is done,
    which would turn a finished run into a failed one."""
    import atexit
    import logging
    import os

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _exit_without_native_teardown()
