"""MkDocs hooks: the reference pages are generated from the code at build time, so they cannot drift.

- `<!-- generate: spec -->` becomes the field tables of `BatchedDeploymentSpec` and the models it
  nests, from their docstrings and field descriptions (name, type, default, description,
  constraints). A spec field without a description stops the build, naming the field.
- `<!-- generate: status -->` becomes the tables of the status schema in the generated CRD.
- `<!-- generate: replica-metrics -->`, `<!-- generate: generation-metrics -->`,
  `<!-- generate: operator-metrics -->` and `<!-- generate: router-metrics -->` become the metric
  families that a replica, the operator and the router register with prometheus-client: name as
  scraped, type, labels, help text.

The hooks also put a few repository files into the site where the pages link to them (the README
as the home page, examples, raw benchmark results and charts, the dashboard, the CRD), so those
links work in the built site as they do on the repository's web view.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

from mkdocs.structure.files import File, Files
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]

# Repository files the pages link to, as globs relative to the repository root; each lands in the
# site at the same path (`examples/minilm.yaml` is linked as `examples/minilm.yaml` from the home
# page and as `../examples/minilm.yaml` from a page one folder down).
REPOSITORY_FILES = (
    "README.md",
    "CONTRIBUTING.md",
    "examples/*.yaml",
    "examples/*.py",
    "bench/results/*.md",
    "bench/results/*.png",
    "bench/results/*/*.md",  # a run kept apart, such as `make bench`'s
    "bench/results/*/*.png",
    "charts/batchd/dashboards/*.json",
    "charts/batchd/values.yaml",
    "crds/*.yaml",
)

# Fields that embed a Kubernetes type keep Kubernetes' own schema; without a description of their
# own, they are described by what Kubernetes calls them.
POD_SPEC = "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/"
KUBERNETES_FIELDS = {
    "nodeSelector": f"Passed to the replica pods as the pod's [`nodeSelector`]({POD_SPEC}#scheduling).",
    "tolerations": f"Passed to the replica pods as the pod's [`tolerations`]({POD_SPEC}#scheduling).",
    "affinity": f"Passed to the replica pods as the pod's [`affinity`]({POD_SPEC}#scheduling).",
    "env": f"Added to the replica container's [`env`]({POD_SPEC}#environment-variables).",
    "volumes": f"Added to the replica pods' [`volumes`]({POD_SPEC}#volumes).",
    "volumeMounts": f"Added to the replica container's [`volumeMounts`]({POD_SPEC}#volumes).",
}

MARKER = re.compile(r"<!-- generate: ([a-z-]+) -->")


class MissingDescription(ValueError):
    """A spec field that the reference cannot describe."""


# Hooks ------------------------------------------------------------------------------------------


def on_files(files: Files, config: Any) -> Files:
    for pattern in REPOSITORY_FILES:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            if files.get_file_from_path(relative) is None:
                files.append(File(relative, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if page.file.src_uri == "README.md":
        # On the repository's web view the README links to docs/...; in the site those pages are
        # its siblings.
        markdown = markdown.replace("](docs/", "](")
    return MARKER.sub(lambda match: GENERATORS[match.group(1)](), markdown)


# The spec ---------------------------------------------------------------------------------------


def spec_reference(root: type[BaseModel] | None = None, path: str = "spec") -> str:
    """Markdown tables of a spec model and every model it nests, one section per model."""
    if root is None:
        from batchd.api.spec import BatchedDeploymentSpec

        root = BatchedDeploymentSpec
    return "\n".join(_model_sections(root, path, seen=set()))


def _model_sections(model: type[BaseModel], path: str, seen: set[type[BaseModel]]) -> Iterator[str]:
    seen.add(model)
    schema = model.model_json_schema(by_alias=True, mode="validation")
    defs = schema.get("$defs", {})
    nested: list[tuple[type[BaseModel], str]] = []
    rows = ["| field | type | default | description | constraints |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        key = field.alias or name
        child = _nested_model(field.annotation)
        node = _resolve(schema["properties"][key], defs)
        many = node.get("type") == "array"
        child_path = f"{path}.{key}" + ("[]" if many else "")
        description = field.description or (child.__doc__ if child else None) or KUBERNETES_FIELDS.get(key)
        if not description:
            raise MissingDescription(
                f"{path}.{key} ({model.__name__}.{name}) has no description: give it a docstring "
                "or Field(description=...) in the spec model"
            )
        if child is not None:
            # A model nested twice (inputs and outputs) is described once, where it first appears.
            earlier = [where for model_, where in nested if model_ is child]
            if earlier:
                child_path = earlier[0]
            elif child not in seen:
                nested.append((child, child_path))
        label = f"[`{key}`](#{_anchor(child_path)})" if child is not None else f"`{key}`"
        default = "required" if field.is_required() else _value(field.get_default(call_default_factory=True))
        rows.append(
            "| "
            + " | ".join([label, _type(node, defs), default, _cell(description), _constraints(node, defs)])
            + " |"
        )
    doc = _cell(model.__doc__ or "")
    yield f"### `{path}` {{#{_anchor(path)}}}\n\n{doc}\n\n" + "\n".join(rows) + "\n"
    for child, child_path in nested:
        yield from _model_sections(child, child_path, seen)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _nested_model(argument)
        if found is not None:
            return found
    return None


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with `X | None` unwrapped and `$ref`s followed (the property's own keys win)."""
    if "anyOf" in node:
        branches = [branch for branch in node["anyOf"] if branch.get("type") != "null"]
        if len(branches) == 1:
            rest = {key: value for key, value in node.items() if key != "anyOf"}
            return _resolve({**branches[0], **rest}, defs)
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return _resolve({**target, **{k: v for k, v in node.items() if k != "$ref"}}, defs)
    return node


def _type(node: dict[str, Any], defs: dict[str, Any]) -> str:
    node = _resolve(node, defs)
    if "enum" in node or "const" in node:
        return "string"
    kind = node.get("type", "any")
    if kind == "array":
        items = node.get("items")
        return f"array of {_type(items, defs)}" if items else "array"
    if kind == "object" and "properties" not in node:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"map of string to {_type(extra, defs)}"
        return "object (free-form)"
    return str(kind)


def _constraints(node: dict[str, Any], defs: dict[str, Any], prefix: str = "") -> str:
    node = _resolve(node, defs)
    parts = []
    if "enum" in node:
        parts.append("one of " + ", ".join(f"`{value}`" for value in node["enum"]))
    if "const" in node:
        parts.append(f"`{node['const']}`")
    for key, text in (
        ("minimum", ">= {}"),
        ("exclusiveMinimum", "> {}"),
        ("maximum", "<= {}"),
        ("exclusiveMaximum", "< {}"),
        ("minLength", "at least {} character(s)"),
        ("maxLength", "at most {} characters"),
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
        ("maxProperties", "at most {} entries"),
    ):
        if key == "minLength" and node.get(key) == 1:
            parts.append("not empty")
        elif key in node:
            parts.append(text.format(_number(node[key])))
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    items = node.get("items")
    if node.get("type") == "array" and isinstance(items, dict) and "properties" not in _resolve(items, defs):
        inner = _constraints(items, defs)
        if inner:
            parts.append(f"each item {inner}")
    return _cell(prefix + ", ".join(parts))


def _number(value: Any) -> str:
    return f"{value:,}".replace(",", " ") if isinstance(value, int) and abs(value) >= 10_000 else str(value)


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "each field's default"
    return f"`{json.dumps(value)}`"


def _anchor(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


# The status, from the generated CRD -------------------------------------------------------------


def status_reference() -> str:
    from batchd.api.crd import crd

    (version,) = crd()["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return "\n".join(_status_sections(status, "status"))


def _status_sections(node: dict[str, Any], path: str) -> Iterator[str]:
    rows = ["| field | type | description |", "|---|---|---|"]
    nested = []
    for key, child in node.get("properties", {}).items():
        target = child.get("items", child) if child.get("type") == "array" else child
        child_path = f"{path}.{key}" + ("[]" if child.get("type") == "array" else "")
        label = f"`{key}`"
        if "properties" in target:
            nested.append((target, child_path))
            label = f"[`{key}`](#{_anchor(child_path)})"
        kind = (
            _type(child, {})
            if "properties" not in target
            else ("array of object" if target is not child else "object")
        )
        if child.get("format") == "date-time":
            kind = "timestamp (RFC 3339)"
        description = child.get("description", "")
        if "enum" in child:
            description += " One of " + ", ".join(f"`{value}`" for value in child["enum"]) + "."
        rows.append(f"| {label} | {kind} | {_cell(description)} |")
    yield (
        f"### `{path}` {{#{_anchor(path)}}}\n\n{_cell(node.get('description', ''))}\n\n"
        + "\n".join(rows)
        + "\n"
    )
    for child, child_path in nested:
        yield from _status_sections(child, child_path)


# Metrics ----------------------------------------------------------------------------------------

_SUFFIX = {"counter": "_total", "gauge": "", "histogram": "", "summary": ""}
_TYPE_NOTE = {"histogram": "histogram (`_bucket`, `_sum`, `_count`)"}


def replica_metrics() -> str:
    from batchd.replica.metrics import ReplicaMetrics

    return _metric_table(_families(ReplicaMetrics("DEPLOYMENT", "MODEL").registry))


def generation_metrics() -> str:
    from batchd.replica.metrics import GenerationMetrics, ReplicaMetrics

    registry = ReplicaMetrics("DEPLOYMENT", "MODEL").registry
    before = {row[0] for row in _families(registry)}
    GenerationMetrics(registry, "DEPLOYMENT", "MODEL")
    return _metric_table([row for row in _families(registry) if row[0] not in before])


def _families(registry: Any) -> list[tuple[str, str, dict[str, list[str]], str]]:
    """(name as scraped, type, {label: values seen}, help) for every family a registry collects."""
    rows = []
    for family in registry.collect():
        labels: dict[str, list[str]] = {}
        for sample in family.samples:
            for label, value in sample.labels.items():
                if label != "le" and value not in labels.setdefault(label, []):
                    labels[label].append(value)
        rows.append((family.name + _SUFFIX[family.type], family.type, labels, family.documentation))
    return rows


def operator_metrics() -> str:
    from batchd.operator import metrics

    return _metric_table(_declared(vars(metrics).values()))


def router_metrics() -> str:
    from batchd.router.metrics import RouterMetrics

    return _metric_table(_declared(vars(RouterMetrics()).values()))


def _declared(values: Any) -> list[tuple[str, str, dict[str, list[str]], str]]:
    """The rows of every metric among `values`, labelled or not, before any series exists."""
    from prometheus_client.metrics import MetricWrapperBase

    rows: list[tuple[str, str, dict[str, list[str]], str]] = []
    for value in values:
        if isinstance(value, MetricWrapperBase):
            # A metric per resource has no series before the first resource: its label names are
            # known only to the metric (prometheus-client keeps them private).
            names: tuple[str, ...] = value._labelnames
            for family in value.collect():
                labels: dict[str, list[str]] = {label: [] for label in names}
                for sample in family.samples:
                    for label, seen in sample.labels.items():
                        if label in labels and seen not in labels[label]:
                            labels[label].append(seen)
                rows.append((family.name + _SUFFIX[family.type], family.type, labels, family.documentation))
    return rows


def _metric_table(rows: list[tuple[str, str, dict[str, list[str]], str]]) -> str:
    if not rows:
        raise ValueError("no metric families found: has the metrics module moved?")
    lines = ["| metric | type | labels | help |", "|---|---|---|---|"]
    for name, kind, labels, help_text in rows:
        described = []
        for label, values in labels.items():
            fixed = label in ("deployment", "model", "namespace", "replica") or not values
            described.append(f"`{label}`" if fixed else f"`{label}`: " + ", ".join(f"`{v}`" for v in values))
        lines.append(
            f"| `{name}` | {_TYPE_NOTE.get(kind, kind)} | {'; '.join(described)} | {_cell(help_text)} |"
        )
    return "\n".join(lines) + "\n"


GENERATORS = {
    "spec": spec_reference,
    "status": status_reference,
    "replica-metrics": replica_metrics,
    "generation-metrics": generation_metrics,
    "operator-metrics": operator_metrics,
    "router-metrics": router_metrics,
}
