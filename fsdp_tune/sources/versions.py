"""The library versions fsdp-tune is tested with, and what differs between them: the one door for versions read
(importlib.metadata: no library is imported, so the launcher reads them before any rank starts).

RANGES: per library, the lowest and the newest major.minor that are tested, both ends included. The lowest set is
`constraints-low.txt` (`make test` runs the version-specific tests in a venv of it: `.venv-low`), the newest is
`constraints.txt` (the whole suite) or a newer release where the note says what ran on it. pyproject.toml declares
exactly these (`>=LOW,<NEXT`; tests/unit/test_versions.py reads it back), so `pip install .` without a constraints
file stays inside them.

FACTS: a path that differs by version, a row per range, read where the path is taken (not `if version` checks
scattered through the code). A library outside RANGES is a warning at launch (PF029, before any rank starts); a
library outside a FACTS row that a run takes is a refusal (PF029 as an error), since that path is known to break.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib import metadata

Version = tuple[int, int]


@dataclass(frozen=True)
class Range:
    """major.minor from `low` to `high`, both included; `tested` says what ran at each end."""

    low: Version
    high: Version
    tested: str = ""

    def __contains__(self, version: str | None) -> bool:
        return version is not None and self.low <= major_minor(version) <= self.high

    def text(self) -> str:
        low, high = _dotted(self.low), _dotted(self.high)
        return low if low == high else f"{low} to {high}"

    def requirement(self) -> str:
        """pyproject.toml's specifier: the lowest tested, and below the minor after the newest tested."""
        return f">={_dotted(self.low)},<{self.high[0]}.{self.high[1] + 1}"


RANGES: dict[str, Range] = {
    # torch 2.11 is the GPU image's: run by the GPU check's Python 3.12 mirror rehearsal at an earlier revision
    # (DESIGN.md), not by make test (PyPI's 2.11 is the 5 GB CUDA build); the one end not run in the suite
    "torch": Range((2, 11), (2, 13), "2.13 (CPU) in make test; 2.11 the GPU image's (above)"),
    # 5.25 with accelerate 1.16 (pip's picks without constraints, 2026-12-06): the CPU demo, tests/dist/test_vision.py
    # and the vision, shim and env lib tests, by hand (not in make test)
    "transformers": Range((5, 17), (5, 25), "5.17 in .venv-low; 5.24 the suite; 5.25 by hand (above)"),
    "accelerate": Range((1, 15), (1, 16), "1.15 in both venvs; 1.16 by hand (above)"),
    "peft": Range((0, 21), (0, 21), "0.21.2 in both venvs"),
    "trl": Range((1, 16), (1, 16), "1.16.0 in both venvs"),
    "bitsandbytes": Range((0, 50), (0, 50), "0.50.2 in both venvs"),
    "datasets": Range((5, 2), (5, 2), "5.2.0 in both venvs"),
}


@dataclass(frozen=True)
class Fact:
    """A version-specific path: which library's range it holds for, and what breaks outside it."""

    library: str
    range: Range
    what: str


FACTS: dict[str, Fact] = {
    # worker/cpu_fsdp.py re-applies AcceleratorState's FSDP branch on CPU; the branch (state.py, the MULTI_GPU/...
    # case: distributed_type, mixed precision, fsdp_plugin, PartialState's copy) is unchanged from 1.12 to 1.16
    "cpu_shim": Fact(
        "accelerate",
        Range((1, 12), (1, 16), "1.15 and 1.16 trained the CPU demo"),
        "a CPU run goes through fsdp-tune's CPU FSDP shim (accelerate's FSDP branch of AcceleratorState, re-applied)",
    ),
}


def major_minor(version: str) -> Version:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def _dotted(version: Version) -> str:
    return ".".join(map(str, version))


def installed(name: str) -> str | None:
    """The installed distribution's version, None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    """fsdp-tune, Python and each library in RANGES, as installed (the manifest and `fsdp-tune env` record them)."""
    from fsdp_tune import __version__

    out: dict[str, str | None] = {"fsdp-tune": __version__, "python": sys.version.split()[0]}
    out.update({name: installed(name) for name in RANGES})
    return out


def tested(found: dict[str, str | None]) -> dict[str, dict]:
    """Each installed library's tested range and whether `found`'s version is in it (`fsdp-tune env`)."""
    return {name: {"range": r.text(), "in_range": found[name] in r} for name, r in RANGES.items() if found.get(name)}


def outside() -> list[tuple[str, str, Range]]:
    """(library, installed version, tested range) for each installed library outside its range."""
    return [(name, found, r) for name, r in RANGES.items() if (found := installed(name)) and found not in r]


def fact_holds(name: str) -> tuple[bool, str | None]:
    """Whether FACTS[name]'s path was checked against the installed library: (holds, the installed version)."""
    fact = FACTS[name]
    found = installed(fact.library)
    return found in fact.range, found


def fact_message(name: str, found: str | None) -> str:
    fact = FACTS[name]
    return f"{fact.what}, checked against {fact.library} {fact.range.text()}; {fact.library} {found} is installed"


def range_message(name: str, found: str) -> str:
    return f"{name} {found} is outside the versions fsdp-tune is tested with ({name} {RANGES[name].text()})"


def install_hint(name: str) -> str:
    return f'pip install "{name}{RANGES[name].requirement()}" (or pip install -c constraints.txt -e .)'


def fact_hint(name: str) -> str:
    return install_hint(FACTS[name].library)  # the tested range: inside the fact's own in every row


def matches(constraints: str) -> list[str]:
    """Each library whose installed version differs from its pin in a constraints file (one line each)."""
    pins = {}
    for line in open(constraints, encoding="utf-8"):
        name, sep, pin = line.partition("==")
        if sep and not line.startswith("#"):
            pins[name.strip().lower().replace("_", "-")] = pin.strip()
    found = {name: installed(name) for name in RANGES}
    return [f"{n} {found[n]} (pinned {pins.get(n)})" for n in RANGES if (found[n] or "").split("+")[0] != pins.get(n)]


if __name__ == "__main__":  # `python -m fsdp_tune.sources.versions constraints-low.txt`: make test-low's first check
    off = matches(sys.argv[1])
    print(f"{sys.argv[1]}: " + ", ".join(f"{n} {installed(n)}" for n in RANGES))
    if off:
        sys.exit(
            f"error: {', '.join(off)} in this venv, not {sys.argv[1]}'s; hint: rm -rf .venv-low and run make again"
        )
