"""Operator settings, read once at startup from `BATCHD_*` environment variables.

Handlers receive the frozen `Settings` through Kopf's `memo`; nothing reads the environment later,
so a running operator never changes behaviour because a variable changed under it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

VERSION = "0.1.0"


@dataclass(frozen=True)
class Settings:
    """Everything the operator can be told; each default says why it is what it is."""

    # The replica image when a BatchedDeployment names none: the release this operator ships with.
    replica_image: str = f"ghcr.io/batchd/batchd-replica:{VERSION}"
    # Pinned tags by default, so IfNotPresent avoids a registry round trip per pod start.
    image_pull_policy: str = "IfNotPresent"
    # Namespaces to watch; empty = the whole cluster.
    namespaces: tuple[str, ...] = ()
    # Prometheus metrics of the operator's own reconciles, on :9090/metrics; 0 = not served.
    metrics_port: int = 9090
    # Kopf's liveness endpoint; the chart's livenessProbe calls it.
    liveness_endpoint: str = "http://0.0.0.0:8080/healthz"
    # Seconds a replica may take to load and warm its model before the kubelet restarts it:
    # large models on cold nodes pull weights for minutes.
    model_load_timeout_s: int = 900
    # Seconds endpoints need to drop a terminating pod before it stops listening (the preStop sleep).
    drain_delay_s: int = 5
    # Seconds of slack on top of the request timeout and drain delay before SIGKILL.
    termination_margin_s: int = 15
    # A directory that hf:// sources resolve to inside replicas (offline clusters); "" = the hub.
    model_mirror: str = ""
    # The cluster's DNS suffix, for the status URL.
    cluster_domain: str = "cluster.local"
    # Only one operator pod runs (the chart uses the Recreate strategy); set a peering name for HA.
    peering_name: str = ""
    # Where the kubeconfig is when running outside a cluster ("" = in-cluster service account).
    kubeconfig: str = field(default="", repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read `BATCHD_*` variables; a malformed value fails at startup, naming the variable."""
        env = os.environ if environ is None else environ
        defaults = cls()

        def number(name: str, default: int) -> int:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = int(raw)
            except ValueError:
                raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
            if value < 0:
                raise ValueError(f"{name} must not be negative, got {raw!r}")
            return value

        namespaces = tuple(ns.strip() for ns in env.get("BATCHD_NAMESPACES", "").split(",") if ns.strip())
        return cls(
            replica_image=env.get("BATCHD_REPLICA_IMAGE") or defaults.replica_image,
            image_pull_policy=env.get("BATCHD_IMAGE_PULL_POLICY") or defaults.image_pull_policy,
            namespaces=namespaces,
            metrics_port=number("BATCHD_METRICS_PORT", defaults.metrics_port),
            liveness_endpoint=env.get("BATCHD_LIVENESS_ENDPOINT", defaults.liveness_endpoint),
            model_load_timeout_s=number("BATCHD_MODEL_LOAD_TIMEOUT_S", defaults.model_load_timeout_s),
            drain_delay_s=number("BATCHD_DRAIN_DELAY_S", defaults.drain_delay_s),
            termination_margin_s=number("BATCHD_TERMINATION_MARGIN_S", defaults.termination_margin_s),
            model_mirror=env.get("BATCHD_MODEL_MIRROR", defaults.model_mirror),
            cluster_domain=env.get("BATCHD_CLUSTER_DOMAIN") or defaults.cluster_domain,
            peering_name=env.get("BATCHD_PEERING_NAME", defaults.peering_name),
            kubeconfig=env.get("KUBECONFIG", ""),
        )
