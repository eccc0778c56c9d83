"""The command every benchmark shares: options over its defaults, bounds that name the option, the
results written and read back, and a failed run's exit status."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from batchd.bench.kit.command import Benchmark, Flag, Run, main, options_from, parse_args


@dataclass(frozen=True)
class Options:
    repeats: int = 3
    rates: tuple[float, ...] = (10.0, 20.0)
    model: str = "adder"
    pause_s: float = 0.5  # no flag: the command line does not set it


@dataclass(frozen=True)
class Results:
    command: str
    rates: tuple[float, ...]
    answered: dict[str, int]


def measure(run: Run[Options]) -> Results:
    assert run.workdir.is_dir()
    answered = {f"{rate:g}": int(rate) * run.options.repeats for rate in run.options.rates}
    if run.options.model == "broken":
        answered = {}
    return Results(run.record.command, run.options.rates, answered)


TOY = Benchmark(
    module="batchd.bench.toy",
    doc="A toy benchmark.\n\nIt measures nothing real.",
    stem="toy",
    defaults=Options(),
    quick=Options(repeats=1, rates=(10.0,)),
    flags={
        "repeats": Flag("repeats", minimum=1),
        "rates": Flag("offered rates", above=0, maximum=100),
        "model": Flag("which model", choices=("adder", "broken")),
    },
    measure=measure,
    markdown=lambda results: f"# toy\n\n{results.answered}\n",
    results=Results,
    chart=lambda results, path: path.touch(),
    failure=lambda results: None if results.answered else "nothing answered",
)


def test_options_are_the_defaults_or_the_smoke_size_with_what_the_command_line_gave() -> None:
    assert options_from(TOY, parse_args(TOY, [])) == Options()
    assert options_from(TOY, parse_args(TOY, ["--quick"])) == Options(repeats=1, rates=(10.0,))
    given = options_from(TOY, parse_args(TOY, ["--quick", "--rates", "5", "50", "--repeats", "2"]))
    assert given == Options(repeats=2, rates=(5.0, 50.0))


@pytest.mark.parametrize(
    ("argv", "refusal"),
    [
        (["--repeats", "0"], "--repeats: expected 1 or more, got 0"),
        (["--rates", "5", "0"], "--rates: expected more than 0, got 5 0"),
        (["--rates", "500"], "--rates: expected at most 100, got 500"),
        (["--model", "gpt"], "--model: invalid choice: 'gpt'"),
        (["--pause-s", "1"], "unrecognized arguments: --pause-s 1"),
    ],
)
def test_a_value_out_of_bounds_is_refused_naming_the_option_and_the_value(
    argv: list[str], refusal: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(TOY, argv)
    assert exited.value.code == 2
    assert refusal in capsys.readouterr().err


def test_help_gives_each_options_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(TOY, ["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "python -m batchd.bench.toy" in shown and "A toy benchmark." in shown
    assert "offered rates (default: 10 20)" in shown and "(default: adder)" in shown


def test_a_run_writes_its_results_and_report_and_render_writes_them_again(tmp_path: Path) -> None:
    assert main(TOY, ["--quick", "--output-dir", str(tmp_path / "first")]) == 0
    written = json.loads((tmp_path / "first" / "toy.json").read_text())
    assert written == {
        "command": f"python -m batchd.bench.toy --quick --output-dir {tmp_path / 'first'}",
        "rates": [10.0],
        "answered": {"10": 10},
    }
    assert (tmp_path / "first" / "toy.md").read_text() == "# toy\n\n{'10': 10}\n"
    assert (tmp_path / "first" / "toy.png").exists()

    again = tmp_path / "again"
    assert main(TOY, ["--render", str(tmp_path / "first" / "toy.json"), "--output-dir", str(again)]) == 0
    assert (again / "toy.json").read_text() == (tmp_path / "first" / "toy.json").read_text()
    assert (again / "toy.md").read_text() == (tmp_path / "first" / "toy.md").read_text()


def test_a_run_that_measured_nothing_exits_1_saying_why_and_still_writes_what_it_has(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(TOY, ["--model", "broken", "--output-dir", str(tmp_path)]) == 1
    assert "FAILED: nothing answered" in capsys.readouterr().err
    assert json.loads((tmp_path / "toy.json").read_text())["answered"] == {}
