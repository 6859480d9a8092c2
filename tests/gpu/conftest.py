"""The GPU layer: real runs on this machine's GPUs. Every test here is skipped where CUDA is not available
(CI's CPU machines); `make test-gpu` runs them on a GPU machine."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
