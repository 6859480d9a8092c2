"""What a reward function returns, checked every time it is called (on the ranks) and once before launch (the
probe): a list with one value per completion, each a finite number or None. TRL turns None into NaN and leaves such
a row out of that reward; a NaN the function returns itself would be read the same way, silently, so it is refused
here, as are infinities, the wrong length and anything that is not a number."""

from __future__ import annotations

import inspect
import math
from numbers import Real


class RewardError(RuntimeError):
    """A reward function failed or returned what GRPO cannot use: one line naming it and what was wrong."""


def problem(values, expected: int) -> str | None:
    """Why `values` is not a reward list for `expected` completions (None when it is)."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        return f"returned {type(values).__name__}, not a list of numbers"
    if len(values) != expected:
        return f"returned {len(values)} values for {expected} completions (one value per completion)"
    for i, value in enumerate(values):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, Real):
            return f"returned {type(value).__name__} {value!r} at position {i} (a number or None)"
        if not math.isfinite(float(value)):
            return f"returned {value} at position {i} (None, not NaN, says a reward does not apply to a row)"
    return None


def guarded(func, name: str, where: str, step=lambda: None):
    """`func` whose every result is checked; a failure or a bad result raises RewardError (one line). An async
    reward stays async (TRL runs those together on its event loop)."""

    def check(values, expected: int):
        why = problem(values, expected)
        if why is not None:
            raise RewardError(f"reward {name} ({where}) {why}{_when(step)}")
        return values

    def failed(e: Exception) -> RewardError:
        return RewardError(
            f"reward {name} ({where}) raised{_when(step)}: {type(e).__name__}: {' '.join(str(e).split())}"
        )

    def call(*args, **kwargs):
        try:
            values = func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the user's code: anything it raises stops the run, named
            raise failed(e) from e
        return check(values, _expected(kwargs))

    async def acall(*args, **kwargs):
        try:
            values = await func(*args, **kwargs)
        except Exception as e:  # noqa: BLE001
            raise failed(e) from e
        return check(values, _expected(kwargs))

    is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
    wrapper = acall if is_async else call
    wrapper.__name__ = wrapper.__qualname__ = name  # TRL's metric: rewards/NAME/mean
    return wrapper


def _expected(kwargs) -> int:
    return len(kwargs.get("completions") or kwargs.get("prompts") or ())


def _when(step) -> str:
    at = step()
    return f" at step {at}" if at is not None else ""
