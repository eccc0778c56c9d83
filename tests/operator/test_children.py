"""The children built from a spec: valid Kubernetes objects that carry what a GPU model server needs."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

from batchd.api.manifest import load_manifest, parse_manifest
from batchd.api.pod import (
    ACCESS_DIR,
    ACCESS_SIGNING_KEY,
    REVISION_LABEL,
    SIGNING_KEY_PATH,
    TOKEN_AUDIENCE,
    TOKEN_DIR,
    TOKEN_PATH,
)
from batchd.api.revisions import revision_of
from batchd.api.spec import BatchedDeployment
from batchd.operator import children
from batchd.operator.settings import Settings
from batchd.replica.settings import ReplicaSettings
from batchd.testing import ROOT
from batchd.testing.manifests import manifest
from batchd.testing.schemas import KUBERNETES_VERSIONS

SETTINGS = Settings()


def bd(**spec: Any) -> BatchedDeployment:
    model = spec.pop("model", {"task": "feature-extraction", "source": "hf://sentence-transformers/x"})
    return parse_manifest(manifest("minilm", model, namespace="ml", **spec))


GPU = bd(
    num_replicas=3,
    model={"task": "feature-extraction", "source": "pvc://weights/minilm"},
    image="registry.local/batchd-replica:dev",
    resources={"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}, "requests": {"cpu": "2"}},
    nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    affinity={
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    env=[{"name": "HF_HOME", "value": "/cache"}, {"name": "EXTRA", "value": "1"}],
    volumes=[{"name": "shm", "emptyDir": {"medium": "Memory"}}],
    volumeMounts=[{"name": "shm", "mountPath": "/dev/shm"}],
    batching={"request_timeout_s": 120},
    tracing={"endpoint": "http://otel-collector.observability:4318", "sampling_ratio": 0.1},
)
EXAMPLES = [
    load_manifest(path)
    for path in sorted((ROOT / "examples").glob("*.yaml"))
    if yaml.safe_load(path.read_text()).get("kind") == "BatchedDeployment"
]
CASES = [("gpu", GPU), *((example.metadata.name, example) for example in EXAMPLES)]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    (only,) = containers
    return only


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(("case", "spec"), CASES, ids=[case for case, _ in CASES])
def test_every_child_is_valid_for_every_supported_kubernetes(
    case: str, spec: BatchedDeployment, version: str
) -> None:
    for child in children.children(spec, SETTINGS):
        kubernetes_validate.validate(child, version, strict=True)


def test_gpu_resources_and_scheduling_are_passed_through() -> None:
    deployment = children.deployment(GPU, SETTINGS)
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 3
    assert container(deployment)["image"] == "registry.local/batchd-replica:dev"
    assert container(deployment)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "nodeAffinity" in pod["affinity"]


def test_default_image_comes_from_the_settings() -> None:
    spec = bd()
    assert container(children.deployment(spec, Settings(replica_image="mirror/replica:1")))["image"] == (
        "mirror/replica:1"
    )


def test_user_env_overrides_ours_without_duplicates_and_volumes_are_added() -> None:
    deployment = children.deployment(GPU, SETTINGS)
    env = container(deployment)["env"]
    names = [item["name"] for item in env]
    assert len(names) == len(set(names))
    assert {"name": "HF_HOME", "value": "/cache"} in env and {"name": "EXTRA", "value": "1"} in env
    assert {"name": "shm", "mountPath": "/dev/shm"} in container(deployment)["volumeMounts"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in deployment["spec"]["template"]["spec"][
        "volumes"
    ]


def test_pvc_source_is_mounted_read_only_where_the_replica_looks() -> None:
    deployment = children.deployment(GPU, SETTINGS)
    volumes = {volume["name"]: volume for volume in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-weights"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    mounts = {mount["name"]: mount for mount in container(deployment)["volumeMounts"]}
    assert mounts["model-weights"] == {
        "name": "model-weights",
        "mountPath": "/models/weights",
        "readOnly": True,
    }
    assert {"name": "BATCHD_PVC_ROOT", "value": "/models"} in container(deployment)["env"]


def test_probes_use_the_health_routes_and_allow_a_slow_model_load() -> None:
    c = container(children.deployment(GPU, SETTINGS))
    assert c["startupProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    startup_budget_s = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert startup_budget_s >= 600
    # Asked often: a replica that can serve is Ready within a couple of seconds.
    assert c["startupProbe"]["periodSeconds"] <= 2 and c["readinessProbe"]["periodSeconds"] <= 2
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["livenessProbe"]["timeoutSeconds"] == 30  # a starved replica is slow, not dead
    assert c["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
    ]
    assert {"name": "BATCHD_METRICS_PORT", "value": "9090"} in c["env"]


def test_pods_drain_before_they_stop() -> None:
    deployment = children.deployment(GPU, SETTINGS)
    pod = deployment["spec"]["template"]["spec"]
    assert container(deployment)["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    assert pod["terminationGracePeriodSeconds"] >= 120 + 5 + 10  # request_timeout_s + preStop + margin
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_security_context_is_hardened() -> None:
    deployment = children.deployment(GPU, SETTINGS)
    pod = deployment["spec"]["template"]["spec"]
    context = container(deployment)["securityContext"]
    assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    # A read-only root still needs somewhere to write: /tmp and the model cache.
    writable = {
        mount["mountPath"] for mount in container(deployment)["volumeMounts"] if not mount.get("readOnly")
    }
    assert {"/tmp", children.CACHE_DIR} <= writable


def test_prometheus_scrapes_the_replica_port() -> None:
    annotations = children.deployment(GPU, SETTINGS)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"
    assert annotations["prometheus.io/path"] == "/metrics"


def test_config_map_holds_the_manifest_the_replica_reads() -> None:
    data = children.config_map(GPU)["data"]["manifest.yaml"]
    reread = parse_manifest(yaml.safe_load(data))
    assert reread.spec.model == GPU.spec.model and reread.spec.batching == GPU.spec.batching
    mounts = container(children.deployment(GPU, SETTINGS))["volumeMounts"]
    assert {"name": "config", "mountPath": "/etc/batchd", "readOnly": True} in mounts
    assert container(children.deployment(GPU, SETTINGS))["args"][:2] == ["serve", "/etc/batchd/manifest.yaml"]


def _template_hash(spec: BatchedDeployment, settings: Settings = SETTINGS) -> str:
    annotations = children.deployment(spec, settings)["spec"]["template"]["metadata"]["annotations"]
    return str(annotations[children.CONFIG_HASH_ANNOTATION])


def test_a_model_or_image_change_rolls_the_pods() -> None:
    base = bd(num_replicas=1)
    assert _template_hash(bd(model={"task": "fill-mask", "source": "hf://x/y"})) != _template_hash(base)
    assert _template_hash(bd(resources={"limits": {"cpu": "2"}})) != _template_hash(base)
    assert _template_hash(base, Settings(replica_image="other:1")) != _template_hash(base)


def test_scaling_autoscaling_and_batching_changes_never_roll_the_pods() -> None:
    base = bd(num_replicas=1)
    for change in (
        bd(num_replicas=7),
        bd(autoscaling={"max_replicas": 4}),
        bd(batching={"max_batch_size": 64, "request_timeout_s": 5}),
    ):
        assert _template_hash(change) == _template_hash(base)
        assert children.service(change) == children.service(base)
    # A scale leaves the replicas' manifest alone; a batching change reaches it, with its revision.
    assert children.config_map(bd(num_replicas=7, autoscaling={"max_replicas": 9})) == children.config_map(
        base
    )
    retuned = parse_manifest(
        yaml.safe_load(children.config_map(bd(batching={"max_batch_size": 64}), 5)["data"]["manifest.yaml"])
    )
    assert (retuned.spec.batching.max_batch_size, retuned.batching_revision) == (64, 5)
    assert retuned.spec.autoscaling is None  # the replica never sees what only the operator acts on


def test_an_access_edit_rolls_no_pod_and_reaches_the_replicas_manifest() -> None:
    base = bd(num_replicas=1)
    keyed = {"tenants": [{"name": "search", "api_keys_secret": "search-keys"}]}
    opened = {**keyed, "anonymous": {"queue_share": 0.2}}
    for change in (bd(num_replicas=1, access=keyed), bd(num_replicas=1, access=opened)):
        assert (
            children.deployment(change, SETTINGS)["spec"]["template"]
            == (children.deployment(base, SETTINGS)["spec"]["template"])
        )
        assert children.revision(change, SETTINGS) == children.revision(base, SETTINGS)
    seen = parse_manifest(yaml.safe_load(children.config_map(bd(access=opened))["data"]["manifest.yaml"]))
    assert seen.spec.access is not None and seen.spec.access.tenants[0].api_keys_secret == "search-keys"


def test_tracing_gives_the_pods_the_standard_opentelemetry_environment() -> None:
    env = {item["name"]: item for item in container(children.deployment(GPU, SETTINGS))["env"]}
    values = {name: item.get("value") for name, item in env.items()}
    assert values["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert values["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert values["OTEL_TRACES_SAMPLER_ARG"] == "0.1"
    assert values["OTEL_SERVICE_NAME"] == "minilm"  # the deployment's name, unless the block names one
    assert values["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] == "false"
    # The pod's own facts come from the downward API, and the resource attributes name them.
    assert env["OTEL_RESOURCE_ATTRIBUTES_POD_NAME"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    attributes = dict(pair.split("=", 1) for pair in values["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attributes["k8s.pod.name"] == "$(OTEL_RESOURCE_ATTRIBUTES_POD_NAME)"
    assert attributes["k8s.namespace.name"] == "$(OTEL_RESOURCE_ATTRIBUTES_NAMESPACE)"
    assert attributes["k8s.deployment.name"] == "minilm"
    assert attributes["service.version"] == children.revision(GPU, SETTINGS)
    names = list(env)  # a $(VAR) reference expands only to a variable defined before it
    assert names.index("OTEL_RESOURCE_ATTRIBUTES") > names.index("OTEL_RESOURCE_ATTRIBUTES_POD_NAME")
    canary = container(children.deployment(GPU, SETTINGS, track="canary"))["env"]
    assert "k8s.deployment.name=minilm-canary" in next(
        item["value"] for item in canary if item["name"] == "OTEL_RESOURCE_ATTRIBUTES"
    )


def test_without_tracing_the_pods_carry_no_opentelemetry_variable() -> None:
    env = container(children.deployment(bd(), SETTINGS))["env"]
    assert not [item for item in env if item["name"].startswith("OTEL_")]


def test_a_tracing_change_rolls_the_pods_and_keeps_the_revision() -> None:
    base, traced = bd(), bd(tracing={"endpoint": "http://jaeger:4318"})
    assert _template_hash(traced) != _template_hash(base)  # the env changed: new pods
    assert children.revision(traced, SETTINGS) == children.revision(base, SETTINGS)  # no canary for it


def test_pods_are_labelled_by_revision_and_a_rollout_change_rolls_nothing() -> None:
    def revision(spec: BatchedDeployment, settings: Settings = SETTINGS) -> str:
        template = children.deployment(spec, settings)["spec"]["template"]["metadata"]
        return str(template["labels"][REVISION_LABEL])

    base = bd(num_replicas=1)
    assert revision(base) == revision_of(base.spec, SETTINGS.replica_image)
    assert revision(bd(model={"task": "fill-mask", "source": "hf://x/y"})) != revision(base)
    assert revision(base, Settings(replica_image="other:1")) != revision(base)
    canary = bd(num_replicas=1, rollout={"strategy": "canary"})
    assert revision(canary) == revision(base) and _template_hash(canary) == _template_hash(base)
    assert children.config_map(canary) == children.config_map(base)  # replicas never read it
    assert REVISION_LABEL not in children.deployment(base, SETTINGS)["spec"]["selector"]["matchLabels"]


def test_service_selects_exactly_this_deployments_pods() -> None:
    service = children.service(GPU)
    deployment = children.deployment(GPU, SETTINGS)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["selector"]["app.kubernetes.io/instance"] == "minilm"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert children.service(bd())["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "batchd"


def test_the_disruption_budget_covers_exactly_this_deployments_pods_one_at_a_time() -> None:
    budget = children.disruption_budget(GPU)
    deployment = children.deployment(GPU, SETTINGS)
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]
    assert budget["spec"]["maxUnavailable"] == 1
    # An unready replica serves nothing: evicting it must never wait on the budget.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_replicas_finish_draining_before_the_kubelet_kills_them() -> None:
    pod = children.deployment(GPU, SETTINGS)["spec"]["template"]["spec"]
    env = {item["name"]: item.get("value") for item in container(children.deployment(GPU, SETTINGS))["env"]}
    sigterm_at = SETTINGS.drain_delay_s  # after the preStop sleep
    assert sigterm_at + int(env["BATCHD_DRAIN_TIMEOUT_S"]) < pod["terminationGracePeriodSeconds"]


def test_a_composer_is_told_where_its_callees_services_are(monkeypatch: pytest.MonkeyPatch) -> None:
    composer = bd(
        model={"handler": "examples.classifier:EmbeddingClassifier", "calls": {"embedder": "minilm"}}
    )
    env = {
        item["name"]: item.get("value") for item in container(children.deployment(composer, SETTINGS))["env"]
    }
    assert json.loads(env["BATCHD_CALLS"]) == {"embedder": "http://minilm.ml.svc.cluster.local:8000"}
    # ... in the form the replica reads (the same URL as the callee's status.url).
    monkeypatch.setenv("BATCHD_CALLS", env["BATCHD_CALLS"])
    assert ReplicaSettings.from_env().calls == {"embedder": children.service_url(bd(), "ml", SETTINGS)}
    # A model that calls nothing is told nothing, and still needs no service account token.
    assert "BATCHD_CALLS" not in {
        item["name"] for item in container(children.deployment(GPU, SETTINGS))["env"]
    }
    assert (
        children.deployment(composer, SETTINGS)["spec"]["template"]["spec"]["automountServiceAccountToken"]
        is False
    )


def test_pods_mount_the_signing_key_alone_and_run_as_their_own_account() -> None:
    composer = bd(
        model={"handler": "examples.classifier:EmbeddingClassifier", "calls": {"embedder": "minilm"}}
    )
    for spec, composes in ((GPU, False), (composer, True)):
        pod = children.deployment(spec, SETTINGS)["spec"]["template"]["spec"]
        canary = children.deployment(spec, SETTINGS, track="canary")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == canary["serviceAccountName"] == "minilm"
        assert pod["automountServiceAccountToken"] is False
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert volumes["access"]["secret"] == {
            "secretName": "minilm-access",
            "items": [{"key": ACCESS_SIGNING_KEY, "path": ACCESS_SIGNING_KEY}],  # no digests
            "defaultMode": 0o440,
        }
        c = container({"spec": {"template": {"spec": pod}}})
        mounts = {mount["name"]: mount for mount in c["volumeMounts"]}
        assert mounts["access"] == {"name": "access", "mountPath": ACCESS_DIR, "readOnly": True}
        env = {item["name"]: item.get("value") for item in c["env"]}
        assert env["BATCHD_SIGNING_KEY_FILE"] == SIGNING_KEY_PATH == f"{ACCESS_DIR}/{ACCESS_SIGNING_KEY}"
        # Only a composer holds a token, and one for batchd's router alone.
        assert ("token" in volumes) is composes and ("BATCHD_TOKEN_FILE" in env) is composes
    (source,) = volumes["token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == TOKEN_AUDIENCE
    assert mounts["token"] == {"name": "token", "mountPath": TOKEN_DIR, "readOnly": True}
    assert env["BATCHD_TOKEN_FILE"] == TOKEN_PATH == f"{TOKEN_DIR}/{source['serviceAccountToken']['path']}"
    account = children.service_account(GPU)
    assert account["metadata"]["name"] == "minilm" and account["automountServiceAccountToken"] is False
    kinds = [child["kind"] for child in children.children(GPU, SETTINGS)]
    assert kinds.index("ServiceAccount") < kinds.index("Deployment")


def test_with_the_router_a_composer_calls_its_callees_through_it_and_clients_are_sent_to_it() -> None:
    routed = Settings(router_url="http://batchd-router.batchd-system.svc/")
    composer = bd(
        model={"handler": "examples.classifier:EmbeddingClassifier", "calls": {"embedder": "minilm"}}
    )
    env = {
        item["name"]: item.get("value") for item in container(children.deployment(composer, routed))["env"]
    }
    # One deployment's path on the router: every call balanced per request, a callee at zero woken.
    assert json.loads(env["BATCHD_CALLS"]) == {
        "embedder": "http://batchd-router.batchd-system.svc/deployments/ml/minilm"
    }
    assert children.service_url(composer, "ml", routed) == "http://batchd-router.batchd-system.svc"


def test_a_canarys_pods_are_never_selected_by_the_stable_service_nor_its_disruption_budget() -> None:
    stable = children.deployment(GPU, SETTINGS)
    canary, service = children.canary_children(GPU, SETTINGS, 1)[1:3]
    canary_labels = canary["spec"]["template"]["metadata"]["labels"]
    for selector in (children.service(GPU)["spec"]["selector"], stable["spec"]["selector"]["matchLabels"]):
        assert not selector.items() <= canary_labels.items()
    assert service["spec"]["selector"].items() <= canary_labels.items()
    assert (canary["metadata"]["name"], service["metadata"]["name"]) == ("minilm-canary", "minilm-canary")
    volumes = canary["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": "minilm-canary-config"}} in volumes
    # The same deployment's pods: the operator's pod watch and the router know them by instance.
    assert canary_labels["app.kubernetes.io/instance"] == "minilm"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_canarys_children_are_valid_for_every_supported_kubernetes(version: str) -> None:
    for child in children.canary_children(GPU, SETTINGS, 2):
        kubernetes_validate.validate(child, version, strict=True)
