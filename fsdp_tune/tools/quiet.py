"""What the libraries print while a one-process tool (chat, merge) loads a model is not the tool's output.

bitsandbytes logs its CPU backend notes on import (peft imports it), transformers and torch warn about
deprecations; the tool's own lines are its output. Errors still surface: only warnings and info are hidden.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def libraries_quiet() -> Iterator[None]:
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
