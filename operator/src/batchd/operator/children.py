"""The children of a BatchedDeployment: pure functions from the validated spec to Kubernetes manifests.

No API calls here, so every manifest can be checked against the real Kubernetes schemas in unit
tests. Owner references are added later by `kopf.adopt`; everything else a pod needs is here.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import yaml

from batchd.api.manifest import document
from batchd.api.pod import (
    ACCESS_DIR,
    ACCESS_SIGNING_KEY,
    CANARY,
    CONFIG_DIR,
    CONFIG_KEY,
    CONFIG_PATH,
    REPLICA_METRICS_PORT,
    REPLICA_PORT,
    REVISION_LABEL,
    RUNTIME_UID,
    SIGNING_KEY_PATH,
    STABLE,
    TOKEN_AUDIENCE,
    TOKEN_DIR,
    TOKEN_PATH,
    Track,
    access_secret_name,
    child_name,
    config_map_name,
    labels,
    selector_labels,
    service_account_name,
)
from batchd.api.revisions import revision_of
from batchd.api.spec import BATCHING_REVISION_ANNOTATION, LIVE_FIELDS, BatchedDeployment
from batchd.api.tracing_config import pod_environment
from batchd.operator.network_policy import network_policy
from batchd.operator.settings import Settings

Manifest = dict[str, Any]

PVC_ROOT = "/models"
CACHE_DIR = "/var/cache/batchd"
CONFIG_HASH_ANNOTATION = "serving.batchd.dev/config-hash"
# Fields of the spec that only the operator acts on.
NOT_FOR_REPLICAS = {"num_replicas", "autoscaling", "rollout"}
CONTAINER = "replica"
CANARY_KINDS = ("Deployment", "Service", "ConfigMap", "NetworkPolicy")
STARTUP_PROBE_PERIOD_S = 1
READINESS_PROBE_PERIOD_S = 2
# Owner and group may read a mounted secret (the pod's fsGroup is the runtime user's), nobody else.
SECRET_FILE_MODE = 0o440
# A composer's projected token: the kubelet renews it at 80% of its life, and the router's
# review cache holds a token's answer at most until it expires.
TOKEN_EXPIRATION_S = 3600


def replica_manifest(bd: BatchedDeployment, batching_revision: int = 0) -> str:
    """The manifest the replica reads, as YAML, with the revision of its `spec.batching`.

    The replica count is left out (the replica does not need it, and scaling must not touch the
    ConfigMap); `spec.batching` is in, and replicas apply a change of it live (see `pod_hash`).
    """
    spec = bd.spec.model_dump(mode="json", by_alias=True, exclude=NOT_FOR_REPLICAS)
    manifest = document(bd.metadata.name, spec, namespace=bd.metadata.namespace)
    manifest["metadata"]["annotations"] = {BATCHING_REVISION_ANNOTATION: str(batching_revision)}
    return yaml.safe_dump(manifest, sort_keys=True)


def pod_hash(bd: BatchedDeployment, image: str) -> str:
    """Changes whenever a new pod is needed: it sits on the pod template, so a change rolls the pods.

    Changes that running replicas take in place are left out: the count, `spec.batching` (live
    retuning through the mounted manifest) and `spec.access` (the replicas follow its tenants'
    queue shares through the manifest, and the router decides who calls).
    """
    spec = bd.spec.model_dump(mode="json", by_alias=True, exclude=NOT_FOR_REPLICAS | set(LIVE_FIELDS))
    text = yaml.safe_dump({"name": bd.metadata.name, "image": image, "spec": spec}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def replica_image(bd: BatchedDeployment, settings: Settings) -> str:
    return bd.spec.image or settings.replica_image


def revision(bd: BatchedDeployment, settings: Settings) -> str:
    """The revision `bd`'s replicas serve: its model, run from its image (or the default)."""
    return revision_of(bd.spec, replica_image(bd, settings))


def config_map(bd: BatchedDeployment, batching_revision: int = 0, track: Track = STABLE) -> Manifest:
    name = bd.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map_name(name, track), "labels": labels(name, track)},
        "data": {CONFIG_KEY: replica_manifest(bd, batching_revision)},
    }


def pvc_claims(bd: BatchedDeployment) -> list[str]:
    """Claims named by a `pvc://claim/path` source: each is mounted read-only at /models/<claim>."""
    source = bd.spec.model.source or ""
    if not source.startswith("pvc://"):
        return []
    claim = source.removeprefix("pvc://").split("/", 1)[0]
    return [claim] if claim else []


def termination_grace_period_s(bd: BatchedDeployment, settings: Settings) -> int:
    """Long enough to finish the slowest accepted request after endpoints have dropped the pod."""
    return (
        math.ceil(bd.spec.batching.request_timeout_s) + settings.drain_delay_s + settings.termination_margin_s
    )


def drain_timeout_s(bd: BatchedDeployment, settings: Settings) -> int:
    """How long a replica may drain after SIGTERM: what is left of the grace period, less 5 s."""
    return max(1, termination_grace_period_s(bd, settings) - settings.drain_delay_s - 5)


def _probe(path: str, *, period_s: int, failures: int, timeout_s: int = 5) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": timeout_s,
    }


def _env(bd: BatchedDeployment, settings: Settings, track: Track = STABLE) -> list[Manifest]:
    ours: list[Manifest] = [
        {"name": "BATCHD_PVC_ROOT", "value": PVC_ROOT},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HOME", "value": "/tmp"},
        # Finish draining before the kubelet's SIGKILL: the grace period less the preStop sleep,
        # less a few seconds to exit.
        {"name": "BATCHD_DRAIN_TIMEOUT_S", "value": str(drain_timeout_s(bd, settings))},
        {"name": "BATCHD_METRICS_PORT", "value": str(REPLICA_METRICS_PORT)},
        # The key the router signs its stamps with: a replica believes only stamps it verifies.
        {"name": "BATCHD_SIGNING_KEY_FILE", "value": SIGNING_KEY_PATH},
    ]
    if settings.model_mirror:
        ours.append({"name": "BATCHD_MODEL_MIRROR", "value": settings.model_mirror})
    if bd.spec.model.calls:
        # Model composition: where each alias of model.calls is, as the replica's handles reach it,
        # and the token its calls authenticate with (as this deployment's own ServiceAccount).
        ours.append(
            {"name": "BATCHD_CALLS", "value": json.dumps(call_addresses(bd, settings), sort_keys=True)}
        )
        ours.append({"name": "BATCHD_TOKEN_FILE", "value": TOKEN_PATH})
    if bd.spec.tracing is not None:
        # The standard OpenTelemetry environment, with the pod's Kubernetes resource attributes; the
        # revision is the service's version, so the spans of a canary and the stable pods differ.
        resource = {
            "k8s.deployment.name": child_name(bd.metadata.name, track),
            "k8s.container.name": CONTAINER,
            "service.version": revision(bd, settings),
        }
        ours += pod_environment(bd.spec.tracing, bd.metadata.name, resource)
    # The user's variables win: theirs replace ours of the same name instead of duplicating them.
    theirs = [dict(item) for item in bd.spec.env]
    overridden = {item.get("name") for item in theirs}
    return [item for item in ours if item["name"] not in overridden] + theirs


def _security_context() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def deployment(
    bd: BatchedDeployment, settings: Settings, replicas: int | None = None, track: Track = STABLE
) -> Manifest:
    """The replicas' Deployment; `replicas` is the count to ask for (default `num_replicas`)."""
    name = bd.metadata.name
    image = replica_image(bd, settings)
    claims = pvc_claims(bd)
    volumes: list[Manifest] = [
        {"name": "config", "configMap": {"name": config_map_name(name, track)}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        *(
            {"name": f"model-{claim}", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
            for claim in claims
        ),
        # The signing key alone: the API keys' digests in the same Secret are the router's only.
        {
            "name": "access",
            "secret": {
                "secretName": access_secret_name(name),
                "items": [{"key": ACCESS_SIGNING_KEY, "path": ACCESS_SIGNING_KEY}],
                "defaultMode": SECRET_FILE_MODE,
            },
        },
        *_token_volume(bd),
        *(dict(volume) for volume in bd.spec.volumes),
    ]
    mounts: list[Manifest] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        *(
            {"name": f"model-{claim}", "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True}
            for claim in claims
        ),
        {"name": "access", "mountPath": ACCESS_DIR, "readOnly": True},
        *({"name": "token", "mountPath": TOKEN_DIR, "readOnly": True} for _ in _token_volume(bd)),
        *(dict(mount) for mount in bd.spec.volume_mounts),
    ]
    container: Manifest = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["batchd"],
        "args": ["serve", CONFIG_PATH, "--host", "0.0.0.0", "--port", str(REPLICA_PORT)],
        "ports": [
            {"name": "http", "containerPort": REPLICA_PORT, "protocol": "TCP"},
            # /metrics alone: the NetworkPolicy lets the scraper reach this port and no other.
            {"name": "metrics", "containerPort": REPLICA_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": _env(bd, settings, track),
        "resources": dict(bd.spec.resources),
        "volumeMounts": mounts,
        # Ready only once the model is loaded and warmed; the startup probe gives it that long. Both
        # ask often (a cheap GET), as Knative's activator does: a replica that can serve is sent
        # requests within a second or two, which a scale-up, a cold start and a canary step wait on.
        "startupProbe": _probe(
            "/v2/health/ready",
            period_s=STARTUP_PROBE_PERIOD_S,
            failures=max(1, math.ceil(settings.model_load_timeout_s / STARTUP_PROBE_PERIOD_S)),
        ),
        # Unready after about 10 s of not answering: asking often must not take a replica out of
        # its Service for a moment's stall.
        "readinessProbe": _probe("/v2/health/ready", period_s=READINESS_PROBE_PERIOD_S, failures=5),
        # A hung handler turns /live to 503 at once; a replica merely too busy to answer (its CPU
        # shared with replicas starting beside it) must not be killed with its queue: Ray Serve's
        # health check waits 30 s too.
        "livenessProbe": _probe("/v2/health/live", period_s=10, failures=3, timeout_s=30),
        # Endpoints drop the pod while it still listens; then SIGTERM drains what it accepted.
        "lifecycle": {"preStop": {"sleep": {"seconds": settings.drain_delay_s}}},
        "securityContext": _security_context(),
    }
    template_annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(REPLICA_METRICS_PORT),
        "prometheus.io/path": "/metrics",
        CONFIG_HASH_ANNOTATION: pod_hash(bd, image),
    }
    pod_spec: Manifest = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_period_s(bd, settings),
        # Its own identity (that of its composed calls), with no token for the API server, which
        # the replica never calls: a composer's token, for batchd's router alone, is projected.
        "serviceAccountName": service_account_name(name),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "fsGroup": RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if bd.spec.node_selector:
        pod_spec["nodeSelector"] = dict(bd.spec.node_selector)
    if bd.spec.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in bd.spec.tolerations]
    if bd.spec.affinity:
        pod_spec["affinity"] = dict(bd.spec.affinity)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": child_name(name, track), "labels": labels(name, track)},
        "spec": {
            "replicas": bd.spec.num_replicas if replicas is None else replicas,
            "selector": {"matchLabels": selector_labels(name, track)},
            # Never below the ready count: a new pod must be ready before an old one goes.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "revisionHistoryLimit": 3,
            # A rollout counts as stuck only after a full model load had its chance.
            "progressDeadlineSeconds": settings.model_load_timeout_s + 300,
            "template": {
                "metadata": {
                    "labels": {
                        **labels(name, track),
                        REVISION_LABEL: revision(bd, settings),
                    },
                    "annotations": template_annotations,
                },
                "spec": pod_spec,
            },
        },
    }


def _token_volume(bd: BatchedDeployment) -> list[Manifest]:
    """A composer's ServiceAccount token for batchd's router (audience TOKEN_AUDIENCE: no other
    service takes it); none for a deployment that calls nobody, which needs no credential."""
    if not bd.spec.model.calls:
        return []
    token = {"audience": TOKEN_AUDIENCE, "expirationSeconds": TOKEN_EXPIRATION_S, "path": "token"}
    return [
        {
            "name": "token",
            "projected": {"sources": [{"serviceAccountToken": token}], "defaultMode": SECRET_FILE_MODE},
        }
    ]


def service_account(bd: BatchedDeployment) -> Manifest:
    """The identity the replicas of both tracks run as: other deployments grant their calls to it
    (RBAC `invoke`, and a tenant's service_accounts). No token is mounted from it by default."""
    name = bd.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": service_account_name(name), "labels": labels(name)},
        "automountServiceAccountToken": False,
    }


def service(bd: BatchedDeployment, track: Track = STABLE) -> Manifest:
    name = bd.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": child_name(name, track), "labels": labels(name, track)},
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(name, track),
            "ports": [{"name": "http", "port": REPLICA_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def disruption_budget(bd: BatchedDeployment) -> Manifest:
    """A voluntary disruption (`kubectl drain`, a node upgrade) takes one replica at a time: the
    eviction API refuses the next until the last one's replacement is Ready. A replica that is
    not Ready may always be evicted: it serves nothing, and a budget spent on it would block every
    drain of its node."""
    name = bd.metadata.name
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "labels": labels(name)},
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def service_url(bd: BatchedDeployment, namespace: str, settings: Settings) -> str:
    """Where clients reach the deployment (`status.url`): the router when it runs (the model name
    in the path picks the deployment, and a deployment at zero wakes), else its own Service."""
    if settings.routers_run:
        return settings.router_url
    return f"http://{bd.metadata.name}.{namespace}.svc.{settings.cluster_domain}:{REPLICA_PORT}"


def call_addresses(bd: BatchedDeployment, settings: Settings) -> dict[str, str]:
    """alias -> where the BatchedDeployment it names (`model.calls`, in the caller's namespace) is
    reached. With the router: the router's path for that one deployment, so that every call is
    balanced across the callee's replicas (a Service balances connections, and a handle keeps its
    connections) and a callee at zero wakes. Without: the callee's Service. Pod to Service over
    HTTP, as any client calls a replica; through the router a call authenticates with the
    composer's projected token (`TOKEN_PATH`), so that the callee grants it like any caller."""
    namespace = bd.metadata.namespace
    if settings.routers_run and namespace:
        return {
            alias: f"{settings.router_url}/deployments/{namespace}/{name}"
            for alias, name in bd.spec.model.calls.items()
        }
    return {
        # Without a namespace (a manifest rendered on its own) the short name, which the pod's DNS
        # search path resolves in its own namespace.
        alias: f"http://{name}.{namespace}.svc.{settings.cluster_domain}:{REPLICA_PORT}"
        if namespace
        else f"http://{name}:{REPLICA_PORT}"
        for alias, name in bd.spec.model.calls.items()
    }


def children(
    bd: BatchedDeployment, settings: Settings, replicas: int | None = None, batching_revision: int = 0
) -> list[Manifest]:
    """All children, in the order they must exist: the config and the identity before the pods
    that mount and run as them (the access Secret is the plan's: it is made from Secrets read)."""
    return [
        config_map(bd, batching_revision),
        service_account(bd),
        deployment(bd, settings, replicas),
        service(bd),
        disruption_budget(bd),
        *([network_policy(bd, settings)] if settings.network_policy else []),
    ]


def canary_children(
    bd: BatchedDeployment, settings: Settings, replicas: int, batching_revision: int = 0
) -> list[Manifest]:
    """A canary revision's children, beside the stable ones: `bd` is the spec of the new revision.
    No disruption budget: a canary serves a share the stable revision can take back at once."""
    return [
        config_map(bd, batching_revision, CANARY),
        deployment(bd, settings, replicas, CANARY),
        service(bd, CANARY),
        *([network_policy(bd, settings, CANARY)] if settings.network_policy else []),
    ]
