"""The documentation site builds, and what it shows a reader is true of the code: every manifest is
admitted, every Python snippet imports (and runs, where it needs no server), every command names
something that exists, and the generated reference pages cover the spec and the metrics."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, Field

from batchd.api.manifest import parse_manifest
from batchd.api.spec import KIND, BatchedDeploymentSpec
from batchd.testing import ROOT
from batchd.testing.kubernetes.admission import admit
from batchd.testing.kubernetes.controlplane import ControlPlane

PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks(language: str) -> list[tuple[str, str]]:
    """(where, text) of every fenced block in that language, on every page."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{page.relative_to(ROOT)}:{line}", match.group(2)))
    return found


@functools.cache
def _hooks() -> Any:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "_hooks" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _page(site: Path, path: str) -> str:
    return (site / path / "index.html").read_text()


def _text(html: str) -> str:
    """What a reader sees: the page without its tags (code is highlighted token by token)."""
    return re.sub(r"<[^>]+>", "", html)


def test_the_site_builds_strictly_with_the_readme_as_its_home_page(site: Path) -> None:
    home = (site / "index.html").read_text()
    assert "make demo" in _text(home) and "make test" in _text(home)
    # The README's links into docs/ point at the site's own pages there.
    assert 'href="getting-started/"' in home and "docs/getting-started" not in home


PERFORMANCE_CHARTS = {
    "adaptive": ("adaptive.png",),
    "autoscaling": ("autoscaling.png",),
    "generation": ("generation.png",),
    "router": ("router-keepalive.png", "router-zero.png"),
    "tracing": ("tracing.png",),
    "peers": ("peers.png",),
    "prefix": ("prefix.png",),
    "priority": ("priority.png",),
    "rollouts": ("rollouts.png",),
}


def test_the_performance_pages_show_the_benchmark_charts(site: Path) -> None:
    for page, charts in PERFORMANCE_CHARTS.items():
        html = _page(site, f"performance/{page}")
        for chart in charts:
            assert (site / "bench" / "results" / chart).is_file(), chart
            assert f'src="../../bench/results/{chart}"' in html, (page, chart)


def _spec_fields(model: type[BaseModel], path: str) -> list[tuple[str, str]]:
    fields = []
    for name, field in model.model_fields.items():
        fields.append((path, field.alias or name))
        for inner in (field.annotation, *getattr(field.annotation, "__args__", ())):
            for candidate in (inner, *getattr(inner, "__args__", ())):
                if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                    fields += _spec_fields(candidate, f"{path}.{field.alias or name}")
    return fields


def test_the_reference_describes_every_spec_field_with_the_models_own_words(site: Path) -> None:
    page = _page(site, "reference/batcheddeployment")
    for path, name in _spec_fields(BatchedDeploymentSpec, "spec"):
        assert f"<code>{name}</code>" in page, f"{path}.{name} is missing from the reference"
    description = BatchedDeploymentSpec.model_fields["num_replicas"].description
    assert description and description in page
    assert "<code>ready_replicas</code>" in page  # and the status, from the CRD


def test_a_spec_field_without_a_description_stops_the_build_naming_it() -> None:
    class Batching(BaseModel):
        """How requests are batched."""

        max_batch_size: int = Field(default=8, description="The largest batch.")
        window_s: float = 0.01

    class Spec(BaseModel):
        """A spec."""

        batching: Batching

    with pytest.raises(_hooks().MissingDescription, match=r"spec\.batching\.window_s"):
        _hooks().spec_reference(Spec)


def test_the_metrics_page_lists_every_family_the_replica_the_operator_and_the_router_export(
    site: Path,
) -> None:
    from prometheus_client import CollectorRegistry

    from batchd.operator import metrics as operator_metrics
    from batchd.replica.metrics import GenerationMetrics, ReplicaMetrics
    from batchd.router.metrics import RouterMetrics

    registry = CollectorRegistry()
    ReplicaMetrics("d", "m", registry)
    GenerationMetrics(registry, "d", "m")
    suffix = {"counter": "_total"}
    names = {family.name + suffix.get(family.type, "") for family in registry.collect()}
    declared = [*vars(operator_metrics).values(), *vars(RouterMetrics()).values()]
    names |= {
        family.name + suffix.get(family.type, "")
        for value in declared
        if hasattr(value, "collect") and hasattr(value, "_name")
        for family in value.collect()
    }
    page = _page(site, "operations/metrics")
    assert {name for name in names if f"<code>{name}</code>" not in page} == set()
    assert any(name.startswith("batchd_operator_") for name in names)
    assert "batchd_router_held_requests" in names


MANIFESTS = [
    (where, document)
    for where, text in _blocks("yaml")
    for document in yaml.safe_load_all(text)
    if isinstance(document, dict) and document.get("kind") == KIND
]


def test_the_docs_show_whole_manifests() -> None:
    assert len(MANIFESTS) >= 8


@pytest.mark.parametrize(("where", "document"), MANIFESTS, ids=[where for where, _ in MANIFESTS])
def test_every_manifest_in_the_docs_is_admitted_by_the_crd_and_the_model(
    control_plane: ControlPlane, module_namespace: str, where: str, document: dict[str, Any]
) -> None:
    # The real API server's admission, as `kubectl apply` of the snippet meets it.
    admission = admit(control_plane, module_namespace, document)
    assert admission.admitted, (where, admission.refusal)
    defaulted = {key: admission.stored[key] for key in ("apiVersion", "kind", "spec")}
    parse_manifest({**defaulted, "metadata": document["metadata"]}, origin=where)


PYTHON = _blocks("python")


@pytest.mark.parametrize(("where", "text"), PYTHON, ids=[where for where, _ in PYTHON])
def test_every_python_snippet_imports_and_runs_where_it_needs_no_server(where: str, text: str) -> None:
    tree = ast.parse(text, filename=where)
    namespace: dict[str, Any] = {}
    if "localhost" in text:  # talks to a running replica: its imports must still work
        imports: list[ast.stmt] = [
            node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
        ]
        tree = ast.Module(body=imports, type_ignores=[])
    exec(compile(tree, where, "exec"), namespace)


def _named(pattern: str) -> set[str]:
    return {name for page in PAGES for name in re.findall(pattern, page.read_text(), re.MULTILINE)}


def test_every_python_m_command_names_a_module_that_exists() -> None:
    modules = _named(r"python -m\s+([A-Za-z_][\w.]*)")
    assert "batchd.bench.adaptive" in modules
    missing = {name for name in modules if importlib.util.find_spec(name) is None}
    assert missing == set()


def test_every_make_target_named_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.MULTILINE))
    named = _named(r"(?:`|^\s*)make ([a-z][\w-]*)")  # as a command: in code, or a line of its own
    assert {"demo", "test"} <= named
    assert named - targets == set()


def test_the_readme_links_only_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = {link.split("#")[0] for link in re.findall(r"\]\(([^)#:]+(?:#[^)]*)?)\)", readme)}
    assert {target for target in targets if not (ROOT / target).exists()} == set()
    assert len(readme.splitlines()) < 200


HISTORY = re.compile(r"\bissues? #?\d+|\bwave\b|\bthe seeds'|\bthis session\b|\bissue's\b", re.IGNORECASE)


def test_no_page_speaks_of_issues_or_history() -> None:
    found = [
        f"{page.relative_to(ROOT)}: {match.group(0)}"
        for page in PAGES
        for match in HISTORY.finditer(page.read_text())
    ]
    assert found == []


def _schema_paths(node: dict[str, Any], prefix: str) -> set[str]:
    paths = {prefix}
    node = node.get("items", node)
    for name, child in node.get("properties", {}).items():
        paths |= _schema_paths(child, f"{prefix}.{name}")
    return paths


def test_every_spec_and_status_field_named_exists_in_the_crd() -> None:
    from batchd.api.crd import crd

    (version,) = crd()["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]["properties"]
    known = _schema_paths(root["spec"], "spec") | _schema_paths(root["status"], "status")
    named = _named(r"(?<![\w/])((?:spec|status)(?:\.[a-z_][A-Za-z_]*)+)")
    assert {"spec.batching", "status.url"} <= named
    assert named - known == set()


def test_every_metric_named_is_one_the_replica_the_operator_or_the_router_exports(site: Path) -> None:
    page = _text(_page(site, "operations/metrics"))
    exported = set(re.findall(r"\bbatchd_\w+", page))
    named = {name.removesuffix("_bucket") for name in _named(r"\b(batchd_[a-z_]+)")}
    assert named - exported == set()


def test_every_environment_variable_named_is_a_setting() -> None:
    from batchd.api.environment import variable_of
    from batchd.operator.settings import Settings
    from batchd.replica.settings import ReplicaSettings
    from batchd.router.settings import RouterSettings

    kinds = (ReplicaSettings, Settings, RouterSettings)
    settings = {variable_of(kind, field) for kind in kinds for field in kind.model_fields}
    named = _named(r"\b(BATCHD_[A-Z_]+[A-Z])\b")
    assert named - settings == set()
    reference = (ROOT / "docs" / "reference" / "settings.md").read_text()
    assert {variable for variable in settings if f"`{variable}`" not in reference} == set()
