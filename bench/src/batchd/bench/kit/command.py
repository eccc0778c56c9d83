"""Every benchmark's command, written once.

`python -m batchd.bench.<name>` reads the options its package declares over the package's
defaults (or its smoke size, `--quick`), measures in a working folder (a temporary one unless
`--workdir`), writes `<stem>.json`, `.md` and, where it draws one, `.png` under `--output-dir`,
prints the report, and exits 1 saying why when the run measured nothing it can stand behind.
`--render JSON` measures nothing: it writes the report and chart of results written before.

A benchmark package declares itself as a `Benchmark` in its `__init__`; its `__main__` is
`sys.exit(main(BENCHMARK))`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from batchd.bench.kit import RESULTS_DIR, records
from batchd.bench.kit.records import RunRecord

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

OptionsT = TypeVar("OptionsT", bound="DataclassInstance")
ResultsT = TypeVar("ResultsT")


@dataclass(frozen=True)
class Flag:
    """An option of the command line; it sets the `Options` field of its name (`--duration-s` sets
    `duration_s`), and a value out of its bounds is refused naming the option and the value."""

    help: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None  # the least value allowed
    above: float | None = None  # values must be more than this
    maximum: float | None = None

    def refusal(self, value: float) -> str | None:
        """Why `value` is out of bounds, or None."""
        if self.minimum is not None and value < self.minimum:
            return f"expected {self.minimum:g} or more"
        if self.above is not None and not value > self.above:
            return f"expected more than {self.above:g}"
        if self.maximum is not None and value > self.maximum:
            return f"expected at most {self.maximum:g}"
        return None


@dataclass(frozen=True)
class Run(Generic[OptionsT]):
    """What a measurement is given: its options, a folder for its servers' files and logs, where
    its results go, this run's record, and the parsed command line (for what is no option)."""

    options: OptionsT
    workdir: Path
    output_dir: Path
    record: RunRecord
    args: argparse.Namespace


def _nothing_failed(_results: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Benchmark(Generic[OptionsT, ResultsT]):
    module: str  # as `python -m` takes it
    doc: str | None  # its first paragraph is the command's description
    stem: str  # results/<stem>.json, .md, .png
    defaults: OptionsT
    quick: OptionsT  # smoke-sized: what the tests run
    flags: Mapping[str, Flag]  # the options the command line sets, by field name
    measure: Callable[[Run[OptionsT]], ResultsT]
    markdown: Callable[[ResultsT], str]
    results: type[ResultsT]  # what `--render` reads a .json back as
    chart: Callable[[ResultsT, Path], None] | None = None
    failure: Callable[[ResultsT], str | None] = _nothing_failed  # why a run counts as failed
    extra_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    check: Callable[[argparse.Namespace], str | None] | None = None  # why other arguments are refused
    # The stem by options, where one benchmark writes apart per setting (say, per device).
    stem_for: Callable[[OptionsT], str] | None = None
    workdir_help: str = "keep the servers' files and logs here"
    log_level: int = logging.INFO
    quiet_loggers: tuple[str, ...] = ("httpx",)


def parse_args(benchmark: Benchmark[Any, Any], argv: Sequence[str]) -> argparse.Namespace:
    summary = " ".join((benchmark.doc or "").split("\n\n")[0].split())  # its first paragraph
    parser = argparse.ArgumentParser(prog=f"python -m {benchmark.module}", description=summary)
    parser.add_argument("--quick", action="store_true", help="smoke-sized: short runs, one repeat")
    hints = typing.get_type_hints(type(benchmark.defaults))
    for name, flag in benchmark.flags.items():
        _add_flag(parser, name, hints[name], flag, getattr(benchmark.defaults, name))
    if benchmark.extra_arguments is not None:
        benchmark.extra_arguments(parser)
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR, help="results go here")
    if benchmark.workdir_help is not None:
        parser.add_argument("--workdir", type=Path, default=None, help=benchmark.workdir_help)
    parser.add_argument(
        "--render", type=Path, default=None, metavar="JSON", help="measure nothing: report this .json again"
    )
    args = parser.parse_args(argv)
    for name, flag in benchmark.flags.items():
        value = getattr(args, name)
        for one in value if isinstance(value, list) else [value]:
            why = None if one is None or isinstance(one, str) else flag.refusal(one)
            if why is not None:
                parser.error(f"--{name.replace('_', '-')}: {why}, got {_shown(value)}")
    why = None if benchmark.check is None else benchmark.check(args)
    if why is not None:
        parser.error(why)
    return args


def options_from(benchmark: Benchmark[OptionsT, Any], args: argparse.Namespace) -> OptionsT:
    """The defaults (or the smoke size) with every option the command line gave (lists as tuples)."""
    base = benchmark.quick if args.quick else benchmark.defaults
    given = {name: getattr(args, name) for name in benchmark.flags if getattr(args, name) is not None}
    return dataclasses.replace(base, **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})


def main(
    benchmark: Benchmark[OptionsT, ResultsT],
    argv: Sequence[str] | None = None,
    measure: Callable[[Run[OptionsT]], ResultsT] | None = None,
) -> int:
    """The command; `measure`, when given, runs in place of the benchmark's own (a test's, say on
    a cluster the test already has)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(benchmark, argv)
    logging.basicConfig(level=benchmark.log_level, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in benchmark.quiet_loggers:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    output: Path = args.output_dir
    if args.render is not None:
        results = records.from_json(benchmark.results, json.loads(args.render.read_text()))
        publish(benchmark, results, output, args.render.stem)
        return 0
    options = options_from(benchmark, args)
    # SIGTERM unwinds like Ctrl-C, so that the servers a run started are stopped on the way out.
    before = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with tempfile.TemporaryDirectory(prefix=f"{benchmark.module.replace('.', '-')}-") as temporary:
            workdir: Path = args.workdir or Path(temporary)
            workdir.mkdir(parents=True, exist_ok=True)
            run = Run(options, workdir, output, RunRecord.now(benchmark.module, argv), args)
            results = (measure or benchmark.measure)(run)
    finally:
        signal.signal(signal.SIGTERM, before)
    stem = benchmark.stem if benchmark.stem_for is None else benchmark.stem_for(options)
    publish(benchmark, results, output, stem)
    failure = benchmark.failure(results)
    if failure is not None:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 0 if failure is None else 1


def publish(benchmark: Benchmark[Any, ResultsT], results: ResultsT, output: Path, stem: str) -> None:
    """`<stem>.json`, `.md` and the chart, and the report printed."""
    markdown = benchmark.markdown(results)
    output.mkdir(parents=True, exist_ok=True)
    records.write_json(output / f"{stem}.json", results)
    (output / f"{stem}.md").write_text(markdown)
    if benchmark.chart is not None:
        benchmark.chart(results, output / f"{stem}.png")
    print(markdown)
    print(f"results: {output / stem}.json, .md{' and .png' if benchmark.chart else ''}")


def _add_flag(parser: argparse.ArgumentParser, name: str, kind: Any, flag: Flag, default: Any) -> None:
    arguments: dict[str, Any] = {"default": None, "help": f"{flag.help} (default: {_shown(default)})"}
    if typing.get_origin(kind) in (types.UnionType, typing.Union):  # `float | None`: the float
        (kind,) = [argument for argument in typing.get_args(kind) if argument is not type(None)]
    if typing.get_origin(kind) is tuple:
        kind = typing.get_args(kind)[0]
        arguments["nargs"] = "+"
    if flag.choices is not None:
        arguments["choices"] = flag.choices
    parser.add_argument(f"--{name.replace('_', '-')}", type=kind, **arguments)


def _shown(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)
