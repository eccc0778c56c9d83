"""Reading manifests: what `batchd serve` and the operator accept, and how they say no."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchd.api.manifest import ManifestError, load_manifest, parse_manifest
from batchd.testing import ROOT
from batchd.testing.manifests import manifest


def document(**spec: Any) -> dict[str, Any]:
    return manifest("demo", **spec)


def test_defaults_are_those_of_the_design() -> None:
    spec = parse_manifest(document()).spec
    assert spec.num_replicas == 1
    assert (spec.batching.max_batch_size, spec.batching.batch_wait_timeout_s) == (32, 0.01)
    assert (spec.batching.max_queued_requests, spec.batching.request_timeout_s) == (1024, 30)
    assert (spec.model.device, spec.model.dtype) == ("auto", "auto")


def test_the_model_name_defaults_to_the_resource_name() -> None:
    assert parse_manifest(document()).model_name == "demo"
    named = document()
    named["spec"] = {"model": {"handler": "a:b", "name": "adder"}}
    assert parse_manifest(named).model_name == "adder"


def test_kubernetes_fields_keep_their_own_names() -> None:
    spec = parse_manifest(
        document(nodeSelector={"gpu": "a100"}, volumeMounts=[{"name": "m", "mountPath": "/m"}])
    ).spec
    assert spec.node_selector == {"gpu": "a100"}
    assert spec.volume_mounts == [{"name": "m", "mountPath": "/m"}]


@pytest.mark.parametrize(
    ("spec", "field", "value"),
    [
        ({"num_replicas": "abc"}, "spec.num_replicas", "'abc'"),
        ({"num_replicas": -1}, "spec.num_replicas", "-1"),
        ({"batching": {"max_batch_size": 0}}, "spec.batching.max_batch_size", "0"),
        ({"batching": {"batch_wait_timeout_s": -0.5}}, "spec.batching.batch_wait_timeout_s", "-0.5"),
        ({"batching": {"max_batchsize": 8}}, "spec.batching.max_batchsize", "8"),
        ({"model": {"handler": "not a path"}}, "spec.model.handler", "'not a path'"),
        ({"model": {"task": "fill-mask", "handler": "a:b"}}, "spec.model", "exactly one of"),
        ({"model": {}}, "spec.model", "exactly one of"),
        ({"model": {"task": "fill-mask"}}, "spec.model", "model.source is required"),
        ({"model": {"task": "translation", "source": "hf://t5"}}, "spec.model.task", "'translation'"),
        ({"model": {"task": "fill-mask", "source": "s3://b/m"}}, "spec.model.source", "s3://b/m"),
        ({"model": {"handler": "a:b", "device": "tpu"}}, "spec.model.device", "'tpu'"),
        (
            {"access": {"tenants": [{"name": "a", "api_keys_secret": "k"}, {"name": "a"}]}},
            "spec.access.tenants",
            "tenant names must be unique, got 'a' twice",
        ),
        (
            {
                "access": {
                    "tenants": [{"name": "a", "api_keys_secret": "k"}, {"name": "b", "api_keys_secret": "k"}]
                }
            },
            "spec.access.tenants",
            "API keys Secret 'k' is named by tenants 'a' and 'b'",
        ),
        (
            {
                "access": {
                    "tenants": [
                        {"name": "a", "service_accounts": ["ns/x"]},
                        {"name": "b", "service_accounts": ["ns/x"]},
                    ]
                }
            },
            "spec.access.tenants",
            "service account 'ns/x' is named by tenants 'a' and 'b'",
        ),
    ],
)
def test_bad_specs_are_refused_naming_the_field_and_the_value(
    spec: dict[str, object], field: str, value: str
) -> None:
    with pytest.raises(ManifestError) as refused:
        parse_manifest(document(**spec))
    message = str(refused.value)
    assert f"  {field}: " in message
    assert value in message


def test_every_example_manifest_loads() -> None:
    # hpa.yaml and keda.yaml hold other kinds (tests/test_examples.py checks them).
    paths = [path for path in sorted((ROOT / "examples").glob("*.yaml")) if path.stem not in ("hpa", "keda")]
    assert paths
    for path in paths:
        assert load_manifest(path).metadata.name == path.stem.replace("_", "-"), path


def test_the_spec_imports_without_torch() -> None:
    # The operator's image carries no torch: reading a manifest must not need it.
    probe = (
        "import sys, batchd.api.manifest as m; m.load_manifest(sys.argv[1]); print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(ROOT / "examples" / "minilm.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "False"


def test_a_file_without_a_batched_deployment_says_so(tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"
    other.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match="no document with kind: BatchedDeployment"):
        load_manifest(other)
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifest(broken)
    with pytest.raises(ManifestError, match="cannot read"):
        load_manifest(tmp_path / "missing.yaml")
