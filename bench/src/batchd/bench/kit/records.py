"""What every benchmark writes beside its figures: where, when and how it ran, as JSON with no NaN.

Results are frozen dataclasses; `to_json` turns them (and anything nested in them) into what
`json` writes, with a missing figure (NaN, infinity) as null, and `from_json` reads them back,
a null float as NaN again, so that a report can be rendered again from its .json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import shlex
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast


def machine() -> str:
    """The machine in a line: cores this process may use, CPU model, memory, OS."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    return f"{len(os.sched_getaffinity(0))} cores of {model}, {memory_gb:.0f} GB RAM, {platform.system()}"


@dataclass(frozen=True)
class RunRecord:
    """When, where and with what command a benchmark ran."""

    date: str
    machine: str
    command: str

    @classmethod
    def now(cls, module: str, argv: Sequence[str]) -> RunRecord:
        """This run, `module` as `python -m` takes it."""
        return cls(
            date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            machine=machine(),
            command=shlex.join(["python", "-m", module, *argv]),
        )


def to_json(value: Any) -> Any:
    """Dataclasses as objects, tuples as lists, and a missing figure (NaN, infinity) as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: to_json(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


T = TypeVar("T")


def from_json(kind: type[T], data: Any) -> T:
    """`data` (as `json` read it) as a `kind`: dataclasses field by field (keys it does not know
    are left out, fields it lacks keep their defaults), lists, tuples, dicts, optionals, and a
    null float as NaN."""
    return cast(T, _read(kind, data))


def _read(kind: Any, data: Any) -> Any:
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = typing.get_type_hints(kind)
        known = {field.name for field in dataclasses.fields(kind) if field.init}
        return kind(**{name: _read(hints[name], value) for name, value in data.items() if name in known})
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        if data is None and type(None) in arguments:
            return None
        (inner,) = [argument for argument in arguments if argument is not type(None)]
        return _read(inner, data)
    if origin is list:
        return [_read(arguments[0], item) for item in data]
    if origin is tuple:
        return tuple(_read(arguments[0], item) for item in data)
    if origin is dict:
        return {key: _read(arguments[1], value) for key, value in data.items()}
    if kind is float:
        return math.nan if data is None else float(data)
    return data


def read_sections(kind: type[T], path: Path) -> T:
    """`path` as written before, of a `kind` whose every field is a part measured on its own (None
    when not measured): each part read alone, one it cannot read (an older shape) left out, and
    no file read as no part."""
    data = json.loads(path.read_text()) if path.exists() else {}
    hints = typing.get_type_hints(kind)
    parts = {}
    for field in dataclasses.fields(kind):  # type: ignore[arg-type]
        with contextlib.suppress(TypeError, KeyError, ValueError, AttributeError):
            parts[field.name] = _read(hints[field.name], data[field.name])
    return kind(**parts)


def newer(new: T, before: T) -> T:
    """The parts `new` measured, and `before`'s others: parts run apart report together."""
    measured = {field.name: getattr(new, field.name) for field in dataclasses.fields(new)}  # type: ignore[arg-type]
    return dataclasses.replace(before, **{name: part for name, part in measured.items() if part is not None})  # type: ignore[type-var]


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(to_json(data), indent=2) + "\n")


def ran(meta: RunRecord, *details: str) -> str:
    """How a report says where its figures come from: "`command` (date, machine; details)"."""
    extra = "".join(f"; {detail}" for detail in details)
    return f"`{meta.command}` ({meta.date}, {meta.machine}{extra})"
