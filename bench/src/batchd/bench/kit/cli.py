"""What every benchmark's command line shares: its name and description, where results go, the
refusal of a count below one (naming the option and the value), and options over the defaults."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from batchd.bench.kit import RESULTS_DIR

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

OptionsT = TypeVar("OptionsT", bound="DataclassInstance")


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """`python -m module`, described by the first paragraph of its docstring."""
    summary = " ".join((doc or "").split("\n\n")[0].split())
    return argparse.ArgumentParser(prog=f"python -m {module}", description=summary)


def add_output(parser: argparse.ArgumentParser, workdir_help: str | None = None) -> None:
    """--output-dir (bench/results by default) and, with a help text, --workdir."""
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="results go here")
    if workdir_help is not None:
        parser.add_argument("--workdir", type=Path, default=None, help=workdir_help)


def refuse_below_one(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    """Exit 2 naming the first option given below 1 (`--repeats: expected 1 or more, got 0`)."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}: expected 1 or more, got {value}")


def overridden(options: OptionsT, args: argparse.Namespace, *names: str) -> OptionsT:
    """`options` (a dataclass) with each named field the command line gave replaced (lists as tuples)."""
    given: dict[str, Any] = {}
    for name in names:
        value = getattr(args, name)
        if value is not None:
            given[name] = tuple(value) if isinstance(value, list) else value
    return dataclasses.replace(options, **given)


def exit_status(failure: str | None) -> int:
    """0 when a run could be measured; else 1, after saying why on stderr (`FAILED: ...`)."""
    if failure is None:
        return 0
    print(f"FAILED: {failure}", file=sys.stderr)
    return 1
