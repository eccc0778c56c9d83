"""No import cycles among batchd's modules, function-level imports included.

A function-level import hides a cycle from the interpreter until the function runs; it is still a
cycle in the design. The graph is read from the source with `ast`: every `import` and
`from ... import` of a `batchd` module, wherever it stands, except under `if TYPE_CHECKING:`
(annotations only; nothing runs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    for module in ("batchd.api.routes", "batchd.replica.inference", "batchd.operator.kopf_handlers"):
        assert module in graph, sorted(graph)
    assert "batchd.replica.generation.request_level" in graph["batchd.replica.generation.loader"]


def test_no_batchd_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for module in graph.get(todo.pop(), set()) - seen:
            seen.add(module)
            todo.append(module)
    return seen


def test_the_replica_never_imports_the_kubernetes_client() -> None:
    # The replica's image installs batchd-api without its `kube` extra: no kubernetes package there.
    graph = import_graph()
    replica = [module for module in graph if module.startswith("batchd.replica")]
    assert replica
    reached = {module for start in replica for module in reachable(graph, start)}
    assert "batchd.api.kubeclient" not in reached
    assert "batchd.api.kubeclient" in reachable(graph, "batchd.router.app")


def test_the_operator_never_imports_an_http_server() -> None:
    # The operator's image installs batchd-api without its `server` extra: no uvicorn there.
    graph = import_graph()
    operator = [module for module in graph if module.startswith("batchd.operator")]
    reached = {module for start in operator for module in reachable(graph, start)}
    assert "batchd.api.draining" not in reached
    assert "batchd.api.draining" in reachable(graph, "batchd.replica.cli")


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
