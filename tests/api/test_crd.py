"""The CRD refuses what the spec model refuses, for the same field, and is itself a valid CRD.

Admission is the real API server's (`kubectl create --dry-run=server` on the test control plane):
strict field validation, defaulting, the schema and the CEL rules, as `kubectl apply` meets them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from batchd.api import crd
from batchd.api.manifest import ManifestError, parse_manifest
from batchd.api.spec import KIND
from batchd.testing import ROOT
from batchd.testing.kubernetes.admission import admit
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest
from batchd.testing.schemas import KUBERNETES_VERSIONS

COMMITTED = ROOT / crd.CRD_PATH
EXAMPLES = sorted(
    (path, document)
    for path in (ROOT / "examples").glob("*.yaml")
    for document in yaml.safe_load_all(path.read_text())
    if isinstance(document, dict) and document.get("kind") == KIND
)

GOOD: dict[str, Any] = manifest("good")


def committed_crd() -> dict[str, Any]:
    """The CRD as committed in `crds/`: the file is what users apply."""
    document: dict[str, Any] = yaml.safe_load(COMMITTED.read_text())
    return document


def test_committed_crd_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == crd.render(), "run `python -m batchd.api.crd` and commit the result"


def test_kubernetes_validate_has_the_schemas_of_every_supported_version() -> None:
    shipped = {kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()}
    assert set(KUBERNETES_VERSIONS) <= shipped


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_crd_is_a_valid_customresourcedefinition(version: str) -> None:
    kubernetes_validate.validate(committed_crd(), version, strict=True)


def test_crd_has_scale_status_and_printer_columns() -> None:
    version = committed_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.num_replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns["Desired"] == ".status.desired_replicas"  # num_replicas, or the autoscaler's count
    assert columns["Ready"] == ".status.ready_replicas"
    assert columns["Max-Batch"] == ".spec.batching.max_batch_size"
    assert committed_crd()["spec"]["names"]["shortNames"] == ["bd"]


@pytest.mark.parametrize(("path", "document"), EXAMPLES, ids=[path.name for path, _ in EXAMPLES])
def test_every_example_is_admitted_by_the_crd_and_the_model(
    control_plane: ControlPlane, module_namespace: str, path: Path, document: dict[str, Any]
) -> None:
    admission = admit(control_plane, module_namespace, document)
    assert admission.admitted, admission.refusal
    defaulted = {key: admission.stored[key] for key in ("apiVersion", "kind", "spec")}
    defaulted["metadata"] = document["metadata"]
    parsed = parse_manifest(defaulted, origin=str(path))
    # The CRD's defaults are the model's defaults: defaulting first changes nothing the replica sees.
    assert parsed == parse_manifest(document)


def test_crd_defaults_equal_the_model_defaults(control_plane: ControlPlane, module_namespace: str) -> None:
    admission = admit(control_plane, module_namespace, GOOD)
    assert admission.admitted, admission.refusal
    defaulted = admission.stored
    model = parse_manifest(GOOD).spec
    assert defaulted["spec"]["num_replicas"] == model.num_replicas
    assert defaulted["spec"]["batching"] == model.batching.model_dump(exclude_none=True)  # unset: absent
    assert defaulted["spec"]["model"]["device"] == model.model.device


def _with(path: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node = document
    for part in parents:
        node = node.setdefault(part, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return document


_DELETE = object()

# (case, manifest, the field both the CRD and the model must name)
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("negative replicas", _with("spec.num_replicas", -1), "spec.num_replicas"),
    ("replicas as text", _with("spec.num_replicas", "abc"), "spec.num_replicas"),
    ("batch size zero", _with("spec.batching.max_batch_size", 0), "spec.batching.max_batch_size"),
    ("batch size too big", _with("spec.batching.max_batch_size", 5000), "spec.batching.max_batch_size"),
    (
        "negative wait",
        _with("spec.batching.batch_wait_timeout_s", -0.5),
        "spec.batching.batch_wait_timeout_s",
    ),
    ("zero request timeout", _with("spec.batching.request_timeout_s", 0), "spec.batching.request_timeout_s"),
    ("typo in batching", _with("spec.batching.max_batchsize", 8), "spec.batching"),
    ("unknown device", _with("spec.model.device", "tpu"), "spec.model.device"),
    ("unknown task", _with("spec.model.task", "translation"), "spec.model"),
    ("bad handler path", _with("spec.model.handler", "not a path"), "spec.model.handler"),
    (
        "bad source scheme",
        {
            **_with("spec.model.handler", _DELETE),
            "spec": {"model": {"task": "fill-mask", "source": "s3://bucket/model"}},
        },
        "spec.model.source",
    ),
    ("task and handler", _with("spec.model.task", "fill-mask"), "spec.model"),
    ("neither task nor handler", _with("spec.model.handler", _DELETE), "spec.model"),
    ("task without source", {**GOOD, "spec": {"model": {"task": "feature-extraction"}}}, "spec.model"),
    ("model missing", {**GOOD, "spec": {"num_replicas": 1}}, "spec"),
    ("node selector not strings", _with("spec.nodeSelector", {"gpu": 1}), "spec.nodeSelector.gpu"),
    ("tolerations not a list", _with("spec.tolerations", {"key": "x"}), "spec.tolerations"),
    ("uppercase model name", _with("spec.model.name", "MiniLM"), "spec.model.name"),
    ("name too long for a Service", _with("metadata.name", "x" * 64), "metadata.name"),
    ("dotted name", _with("metadata.name", "my.model"), "metadata.name"),
    ("uppercase name", _with("metadata.name", "MyModel"), "metadata.name"),
    (
        "autoscaling min above max",
        _with("spec.autoscaling", {"min_replicas": 5, "max_replicas": 2}),
        "spec.autoscaling",
    ),
    ("autoscaling without max", _with("spec.autoscaling", {"min_replicas": 2}), "spec.autoscaling"),
    (
        "negative min replicas",
        _with("spec.autoscaling", {"min_replicas": -1, "max_replicas": 2}),
        "spec.autoscaling.min_replicas",
    ),
    (
        "negative scale-to-zero delay",
        _with("spec.autoscaling", {"min_replicas": 0, "max_replicas": 2, "scale_to_zero_delay_s": -5}),
        "spec.autoscaling.scale_to_zero_delay_s",
    ),
    (
        "a class's queue timeout of zero",
        _with("spec.batching.priority_classes", [{"name": "search", "priority": 10, "queue_timeout_s": 0}]),
        "spec.batching.priority_classes[0].queue_timeout_s",
    ),
    (
        "a class's negative queue timeout",
        _with("spec.batching.priority_classes", [{"name": "search", "priority": 10, "queue_timeout_s": -2}]),
        "spec.batching.priority_classes[0].queue_timeout_s",
    ),
    (
        "negative downscale delay",
        _with("spec.autoscaling", {"max_replicas": 2, "downscale_delay_s": -1}),
        "spec.autoscaling.downscale_delay_s",
    ),
    ("tracing without an endpoint", _with("spec.tracing", {"sampling_ratio": 0.5}), "spec.tracing"),
    (
        "tracing endpoint not a URL",
        _with("spec.tracing", {"endpoint": "jaeger:4318"}),
        "spec.tracing.endpoint",
    ),
    (
        "sampling ratio above one",
        _with("spec.tracing", {"endpoint": "http://jaeger:4318", "sampling_ratio": 1.5}),
        "spec.tracing.sampling_ratio",
    ),
]


@pytest.mark.parametrize(("manifest", "field"), [(m, f) for _, m, f in BAD], ids=[c for c, _, _ in BAD])
def test_bad_manifest_is_refused_by_both_naming_the_field(
    control_plane: ControlPlane, module_namespace: str, manifest: dict[str, Any], field: str
) -> None:
    admission = admit(control_plane, module_namespace, manifest)
    assert not admission.admitted, "the API server admitted a manifest the model refuses"
    assert field in admission.refusal, admission.refusal

    with pytest.raises(ManifestError) as refused:
        parse_manifest(manifest)
    assert field.split(".")[-1] in str(refused.value)


@pytest.mark.parametrize("timeout_s", [0, -2.5])
def test_a_class_queue_timeout_not_above_zero_is_refused_by_both_naming_the_value(
    control_plane: ControlPlane, module_namespace: str, timeout_s: float
) -> None:
    classes = [{"name": "search", "priority": 10, "queue_timeout_s": timeout_s}]
    manifest = _with("spec.batching.priority_classes", classes)
    admission = admit(control_plane, module_namespace, manifest)
    assert not admission.admitted
    assert f"queue_timeout_s: Invalid value: {timeout_s:g}" in admission.refusal, admission.refusal

    with pytest.raises(ManifestError) as refused:
        parse_manifest(manifest)
    assert f"queue_timeout_s: Input should be greater than 0 (got {timeout_s:g})" in str(refused.value)


# The cross-field rules, case by case: pydantic's validator and the CRD's CEL rules must agree.
MODEL_TABLE: list[tuple[dict[str, Any], bool]] = [
    ({"handler": "m:C"}, True),
    ({"task": "fill-mask", "source": "hf://a/b"}, True),
    ({"task": "fill-mask"}, False),
    ({"source": "hf://a/b"}, False),
    ({}, False),
    ({"task": "fill-mask", "source": "hf://a/b", "handler": "m:C"}, False),
    ({"handler": "m:C", "source": "pvc://claim/x"}, True),
    ({"task": "text-generation", "source": "hf://a/b", "generation": {"scheduling": "request"}}, True),
    ({"task": "fill-mask", "source": "hf://a/b", "generation": {"max_new_tokens": 8}}, False),
    ({"handler": "m:C", "generation": {}}, False),
]


@pytest.mark.parametrize(("model", "valid"), MODEL_TABLE)
def test_cel_rules_agree_with_the_model_validator(
    control_plane: ControlPlane, module_namespace: str, model: dict[str, Any], valid: bool
) -> None:
    manifest = {**GOOD, "spec": {"model": model}}
    admission = admit(control_plane, module_namespace, manifest)
    assert admission.admitted is valid, admission.refusal
    if valid:
        parse_manifest(manifest)
    else:
        with pytest.raises(ManifestError, match="model"):
            parse_manifest(manifest)
