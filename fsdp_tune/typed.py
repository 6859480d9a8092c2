"""Frozen dataclasses to plain JSON data and back, by their type hints: the one conversion the rank spec (and the
other typed files a run writes) goes through. Nested dataclasses, tuples, dicts, optionals and literals are read
back as the hints say; a key the class does not have, or a literal outside its choices, is an error (a spec
written by another fsdp-tune version is refused, not half-read)."""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Literal, Union


def to_plain(value: Any) -> Any:
    """JSON-ready data: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def from_plain(cls: type, data: Any, where: str = "") -> Any:
    """An instance of dataclass `cls` from `to_plain`'s output."""
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = _hints(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    return cls(**{name: _read(hints[name], value, f"{where}.{name}") for name, value in data.items()})


@cache
def _hints(cls: type) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in names}


def _read(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _read(options[0], value, where)
        return value  # a union of several kinds (str | list[str]): as written
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if dataclasses.is_dataclass(hint):
        return from_plain(hint, value, where)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(args[0], v, where) for v in value)
        return tuple(_read(a, v, where) for a, v in zip(args, value, strict=True)) if args else tuple(value)
    if origin is list:
        return [_read(args[0], v, where) for v in value] if args else list(value)
    if origin is dict:
        inner = args[1] if args else Any
        return {k: _read(inner, v, where) for k, v in value.items()}
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value
