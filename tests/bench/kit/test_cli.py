"""Every benchmark's `--help` says what it measures: its docstring's whole first paragraph."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from batchd import bench
from batchd.bench.kit import command

COMMANDS = sorted(
    module.name
    for module in pkgutil.iter_modules(bench.__path__, "batchd.bench.")
    if module.ispkg and module.name != "batchd.bench.kit"
)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_benchmarks_help_ends_its_first_sentence(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"{name}.__main__")
    with pytest.raises(SystemExit) as exited:
        if hasattr(module, "BENCHMARK"):  # the kit's command
            command.main(module.BENCHMARK, ["--help"])
        else:
            module.main(["--help"])
    assert exited.value.code == 0
    description = capsys.readouterr().out.split("\n\n")[1]
    assert description.rstrip().endswith("."), description
