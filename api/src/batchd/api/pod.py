"""What the operator, the router, the replica image and the Helm chart must agree on about the pods:
ports, the runtime user, where the manifest is mounted, and every label, selector and child name.

Each fact lives here once: no other module spells a label batchd puts on its objects or selects
them by (the labels of others, Prometheus' pods or a namespace's name, stay where they are used).
The Dockerfile and the chart cannot import Python, so `tests/test_agreement.py` reads them and
fails when they say something else.
"""

from __future__ import annotations

from typing import Literal

# The port a replica serves inference, health and `GET /load` on (container port named "http").
REPLICA_PORT = 8000
# The port a replica serves /metrics on, alone (container port named "metrics"): a NetworkPolicy
# lets the scraper reach it and nothing else.
REPLICA_METRICS_PORT = 9090
# The non-root UID and GID the operator, replica and router images run as.
RUNTIME_UID = 10001
# Where the operator mounts the replica's manifest, and where `batchd serve` reads it in a pod.
CONFIG_DIR = "/etc/batchd"
CONFIG_KEY = "manifest.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_KEY}"
# The images a release ships, without their tag (the tag is the version).
OPERATOR_IMAGE = "ghcr.io/batchd/batchd-operator"
REPLICA_IMAGE = "ghcr.io/batchd/batchd-replica"
ROUTER_IMAGE = "ghcr.io/batchd/batchd-router"
# The port the router serves clients and health on (container port named "http").
ROUTER_PORT = 8080
# The port the router serves /metrics and `GET /held` (for the operator) on (container port named
# "admin"): never the clients' port.
ROUTER_ADMIN_PORT = 9090

# -- access (`batchd.api.access`, `batchd.api.stamp`) ---------------------------------------------
# The audience a ServiceAccount token must be made for to call through the router (a pod's
# projected token: `serviceAccountToken.audience`), so that a token made for the API server, or for
# anything else, is no credential here.
TOKEN_AUDIENCE = "batchd"
# The verb RBAC must grant a ServiceAccount on a BatchedDeployment for it to call it.
INVOKE_VERB = "invoke"
# The Secret the operator keeps per deployment: the key the router signs its stamps with (mounted
# into the replicas, alone) and the digests of the tenants' API keys (read by the router only).
ACCESS_SIGNING_KEY = "signing-key"
ACCESS_KEYS_KEY = "api-key-digests"
# Where a replica finds the signing key (BATCHD_SIGNING_KEY_FILE), and a composer its projected
# ServiceAccount token (audience TOKEN_AUDIENCE), for its calls through the router.
ACCESS_DIR = "/var/run/batchd/access"
SIGNING_KEY_PATH = f"{ACCESS_DIR}/{ACCESS_SIGNING_KEY}"
TOKEN_DIR = "/var/run/batchd/token"
TOKEN_PATH = f"{TOKEN_DIR}/token"

# -- labels -------------------------------------------------------------------------------------
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"  # the BatchedDeployment a child belongs to
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# On a replica pod and its Deployment's template: the revision it serves (the canary's judge counts
# each revision's answers by it; the router splits a canary's traffic by track, not by this).
REVISION_LABEL = "serving.batchd.dev/revision"
# The label the EndpointSlice controller puts on each slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

# Every child the operator makes carries this label; its watches select on it.
MANAGED_BY = {MANAGED_BY_LABEL: "batchd"}
# Every replica pod, stable or canary, carries this label (the operator's pod watch selects on it).
REPLICA_APP = {NAME_LABEL: "batchd-replica"}
# The router pods' component label (the chart's template): the operator finds them by it.
ROUTER_COMPONENT = {COMPONENT_LABEL: "router"}
# The CRD's own labels.
CRD_LABELS = {NAME_LABEL: "batchd", COMPONENT_LABEL: "crd"}

# -- the two tracks of a BatchedDeployment's children ---------------------------------------------
# The stable revision's children are named after the BatchedDeployment; a canary revision's stand
# beside them during a canary rollout. The component label tells the tracks apart, so the stable
# Service (which selects `replica`) never reaches a canary pod.
Track = Literal["stable", "canary"]
STABLE: Track = "stable"
CANARY: Track = "canary"
TRACK_COMPONENTS: dict[Track, str] = {STABLE: "replica", CANARY: "canary"}
CANARY_SUFFIX = "-canary"
# A Service's name is a DNS-1035 label (at most 63 characters), and a canary's Service adds its
# suffix to the BatchedDeployment's name: with the canary strategy the name is held to this.
MAX_CANARY_OWNER_NAME = 63 - len(CANARY_SUFFIX)


def child_name(name: str, track: Track = STABLE) -> str:
    """A track's Deployment and Service: the stable one's are named after the BatchedDeployment."""
    return name if track == STABLE else f"{name}{CANARY_SUFFIX}"


def config_map_name(name: str, track: Track = STABLE) -> str:
    return f"{child_name(name, track)}-config"


def access_secret_name(name: str) -> str:
    """The Secret of a BatchedDeployment's signing key and API key digests (one for both tracks)."""
    return f"{name}-access"


def service_account_name(name: str) -> str:
    """The ServiceAccount a BatchedDeployment's replicas run as (one for both tracks): the identity
    of its calls to other deployments."""
    return child_name(name)


def selector_labels(name: str, track: Track = STABLE) -> dict[str, str]:
    """The labels that select one BatchedDeployment's pods of one track, and nobody else's."""
    return {**REPLICA_APP, INSTANCE_LABEL: name, COMPONENT_LABEL: TRACK_COMPONENTS[track]}


def labels(name: str, track: Track = STABLE) -> dict[str, str]:
    """Every child's labels: its selector's, and who manages it."""
    return {**selector_labels(name, track), **MANAGED_BY}


def selector_string(name: str, track: Track = STABLE) -> str:
    """The selector in `kubectl get -l` form, for the scale subresource and HPAs."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector_labels(name, track).items()))


def track_of(child_labels: dict[str, str]) -> tuple[str, Track] | None:
    """(the BatchedDeployment, the track) a child or pod belongs to, by its labels; None for an
    object that is not a replica's (a slice of another Service, a pod of something else)."""
    owner = child_labels.get(INSTANCE_LABEL)
    component = child_labels.get(COMPONENT_LABEL)
    if not owner or child_labels.get(NAME_LABEL) != REPLICA_APP[NAME_LABEL]:
        return None
    for track, value in TRACK_COMPONENTS.items():
        if component == value:
            return owner, track
    return None


# The access Secrets' own component label: the router's Secret watch selects on it (with MANAGED_BY).
ACCESS_COMPONENT = {COMPONENT_LABEL: "access"}
ACCESS_SECRET_SELECTOR = ",".join(
    f"{key}={value}" for key, value in sorted({**ACCESS_COMPONENT, **MANAGED_BY}.items())
)

# The router's EndpointSlice watch: the slices of every replica Service, stable and canary. The
# EndpointSlice controller copies a Service's labels onto its slices.
SLICE_SELECTOR = ",".join(
    [
        f"{NAME_LABEL}={REPLICA_APP[NAME_LABEL]}",
        f"{COMPONENT_LABEL} in ({','.join(TRACK_COMPONENTS.values())})",
        f"{MANAGED_BY_LABEL}={MANAGED_BY[MANAGED_BY_LABEL]}",
        SERVICE_NAME_LABEL,
    ]
)
