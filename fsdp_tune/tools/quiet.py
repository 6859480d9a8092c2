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


def quiet_transformers() -> None:
    """transformers' loading bars and notes off; called where a tool imports transformers anyway (not in
    libraries_quiet: a tool's argument checks come first and must not wait for that import)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
