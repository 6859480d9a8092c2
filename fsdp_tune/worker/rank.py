"""Which rank this process is, as torchrun tells it: the one place the worker reads torchrun's environment
(RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT). Every other decision comes in the rank spec
(tests/unit/test_spec_walk.py keeps it so). No torch: the entry point asks before torch is imported."""

from __future__ import annotations

import os


def rank() -> int:
    """This process's global rank (0 outside torchrun: a spec run by hand, a test)."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """The rank within its machine: rank 0 of each machine prepares the data its machine reads."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def restart_count() -> int:
    """torchrun's elastic restarts so far (--max_restarts): 0 on the first attempt."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def is_main() -> bool:
    """Rank 0: it shows the phases, writes the run's files and pushes to the Hub."""
    return rank() == 0
