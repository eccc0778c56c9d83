"""The layers of batchd, as a newcomer reads them and CI enforces them.

Which layer may import which is written once, as import-linter contracts in `pyproject.toml`
(`[tool.importlinter]`): the replica's command above its HTTP front above its core, models never
importing generation, neither the operator nor the router importing the replica, what each image
leaves out, test support below the benchmarks. `make lint` runs them; so does this suite.

Import-linter does not look for cycles, so this module does: no batchd module imports itself
through others, function-level imports included. A function-level import hides a cycle from the
interpreter until the function runs; it is still a cycle in the design. The graph is read from the
source with `ast`: every `import` and `from ... import` of a `batchd` module, wherever it stands,
except under `if TYPE_CHECKING:` (annotations only; nothing runs).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SOURCE_TREES = [path for path in ROOT.glob("*/src") if (path / "batchd").is_dir()]
SOURCE_TREES += [path for path in ROOT.glob("tests/*/src") if (path / "batchd").is_dir()]


def modules() -> dict[str, Path]:
    """Every batchd module: dotted name -> file."""
    found: dict[str, Path] = {}
    for tree in SOURCE_TREES:
        for file in (tree / "batchd").rglob("*.py"):
            parts = file.relative_to(tree).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = file
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, less the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for other in node.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield node
        yield from _runtime_nodes(node)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The batchd modules `name` imports (`from package import module` counts as the module)."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    found.add(submodule)
                elif base in known:
                    found.add(base)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, file, known) for name, file in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_covers_every_component() -> None:
    graph = import_graph()
    for module in ("batchd.api.routes", "batchd.replica.front.asgi", "batchd.operator.kopf_handlers"):
        assert module in graph, sorted(graph)
    assert "batchd.replica.generation.request_level" in graph["batchd.replica.generation.loader"]


def test_no_batchd_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_import_contract_is_kept() -> None:
    checked = subprocess.run([LINT_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in checked.stdout


def test_an_import_across_a_contract_is_refused_naming_the_line(tmp_path: Path) -> None:
    # The project's own contract, over one more portion of the namespace package that breaks it.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c.get("source_modules") == ["batchd.replica.models"]]
    only_it = {"tool": {"importlinter": {"root_packages": ["batchd"], "contracts": [contract]}}}
    (tmp_path / "pyproject.toml").write_text(tomli_w.dumps(only_it))
    models = tmp_path / "batchd" / "replica" / "models"
    models.mkdir(parents=True)
    (models / "shortcut.py").write_text("from batchd.replica.generation import loader\n")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path)}
    checked = subprocess.run(
        [LINT_IMPORTS],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 1, checked.stdout[-3000:]
    assert "batchd.replica.models.shortcut -> batchd.replica.generation.loader (l.1)" in checked.stdout


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ],
)
def test_a_cycle_is_named_in_order(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert find_cycle(graph) == expected


def test_function_level_imports_count_and_type_checking_ones_do_not(tmp_path: Path) -> None:
    (tmp_path / "batchd").mkdir()
    file = tmp_path / "batchd" / "a.py"
    file.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from batchd import c\n"
        "def f():\n    from batchd import b\n"
    )
    known = {"batchd.a": file, "batchd.b": file, "batchd.c": file}
    assert imports_of("batchd.a", file, known) == {"batchd.b"}
