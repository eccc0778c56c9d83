"""Operator settings, read once at startup from `BATCHD_*` environment variables.

Handlers receive the frozen `Settings` through Kopf's `memo`; nothing reads the environment later,
so a running operator never changes behaviour because a variable changed under it.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, NonNegativeInt, PositiveFloat, field_validator

from batchd.api import __version__
from batchd.api.environment import ClusterClientSettings
from batchd.api.pod import REPLICA_IMAGE, ROUTER_COMPONENT

Port = Annotated[int, Field(ge=0, le=65535)]
# The label the Prometheus Operator gives the Prometheus pods it runs.
PROMETHEUS_PODS = {"app.kubernetes.io/name": "prometheus"}


class Settings(ClusterClientSettings):
    """Everything the operator can be told; each default says why it is what it is."""

    # The replica image when a BatchedDeployment names none: the release this operator ships with.
    replica_image: str = f"{REPLICA_IMAGE}:{__version__}"
    # Pinned tags by default, so IfNotPresent avoids a registry round trip per pod start.
    image_pull_policy: str = "IfNotPresent"
    # Prometheus metrics of the operator's own reconciles, on :9090/metrics; 0 = not served.
    metrics_port: Port = 9090
    # Kopf's liveness endpoint; the chart's livenessProbe calls it. "" = not served.
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    # Seconds a replica may take to load and warm its model before the kubelet restarts it:
    # large models on cold nodes pull weights for minutes.
    model_load_timeout_s: NonNegativeInt = 900
    # Seconds endpoints need to drop a terminating pod before it stops listening (the preStop sleep).
    drain_delay_s: NonNegativeInt = 5
    # Seconds of slack on top of the request timeout and drain delay before SIGKILL.
    termination_margin_s: NonNegativeInt = 15
    # Seconds between two reads of every ready replica's load (autoscaling, live-retuning status):
    # fresh enough to follow a load step within a few polls, and 500 resources of 4 replicas cost
    # 400 small HTTP reads a second (see the operator benchmark).
    replica_poll_interval_s: PositiveFloat = 5.0
    # Seconds a replica has to answer one read; one that does not is left out of that decision.
    replica_poll_timeout_s: PositiveFloat = 1.0
    # Seconds between two reads of the routers' GET /held while some deployment is at zero
    # replicas (between full polls): a cold start's first request waits half of it on average on
    # top of the model's load time, and one LIST of router pods plus one small read per router
    # each second costs little.
    wake_poll_interval_s: PositiveFloat = 1.0
    # Seconds between two writes of what the autoscaler saw to status.autoscaling (a scale writes
    # at once): the status is for people and events, the metrics carry every poll, and 500
    # resources writing at every poll would be 100 API (etcd) writes a second.
    autoscaling_status_interval_s: PositiveFloat = 30.0
    # The routers in front of the replicas (the chart's router Deployment), if they run: the
    # Service URL clients and composing replicas call ("" = no router: status.url and model.calls
    # name each deployment's own Service, and nothing wakes a deployment at zero replicas).
    router_url: str = ""
    # The namespace of the router pods, whose GET /held the scaling loop reads at every poll.
    router_namespace: str = ""
    # The label selector of the router pods in `router_namespace` (the chart's release adds its
    # instance label, so that two releases never read each other's routers).
    router_selector: str = ",".join(f"{key}={value}" for key, value in ROUTER_COMPONENT.items())
    # A NetworkPolicy per deployment and track (the chart's networkPolicy.enabled): ingress to the
    # replicas only from the routers, the operator, composers and the scraper. Off: none, and one
    # left from before is deleted (a cluster whose network plugin enforces none, or a mesh's own).
    network_policy: bool = True
    # The operator's own pods (it reads each replica's /load and /metrics): the chart's release
    # namespace and selector. Empty: the policies admit no operator pod (one run outside the
    # cluster, as in tests, is no pod).
    operator_namespace: str = ""
    operator_selector: str = ""
    # Who may scrape the replicas' metrics port: matchLabels of its namespaces ({} = every
    # namespace) and of its pods ({} = every pod there), as JSON in the environment. Default: the
    # Prometheus Operator's own pods, wherever they run.
    scraper_namespace_selector: dict[str, str] = Field(default_factory=dict)
    scraper_pod_selector: dict[str, str] = Field(default_factory=lambda: dict(PROMETHEUS_PODS))
    # A directory that hf:// sources resolve to inside replicas (offline clusters); "" = the hub.
    model_mirror: str = ""
    # The cluster's DNS suffix, for the status URL.
    cluster_domain: str = "cluster.local"
    # Only one operator pod runs (the chart uses the Recreate strategy); set a peering name for HA.
    peering_name: str = ""

    @property
    def routers_run(self) -> bool:
        return bool(self.router_url)

    @field_validator("router_url")
    @classmethod
    def _no_trailing_slash(cls, value: str) -> str:
        return value.rstrip("/")
