"""What the router knows of the cluster: which deployment serves a model, and its ready replicas.

Fed by the watches (`watching`) with the API server's objects as they change, read per request
without any I/O. The functions that read a BatchedDeployment or an EndpointSlice are pure; the
`Directory` keeps their results and tells its listener when a deployment gains its first ready
replica (held requests go) or goes away (held requests fail).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from batchd.api.pod import CANARY_COMPONENT
from batchd.api.priority import NO_CLASSES, PriorityClasses
from batchd.api.spec import BatchingSpec
from batchd.router.errors import AmbiguousModel, UnknownModel

logger = logging.getLogger(__name__)

# The label the EndpointSlice controller puts on each slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# Copied from the operator's Services: a canary revision's Service says which deployment it is of.
INSTANCE_LABEL = "app.kubernetes.io/instance"
# The Service port a replica serves on (the operator names it so, see operator/children.py).
PORT_NAME = "http"
DEFAULT_REQUEST_TIMEOUT_S = float(BatchingSpec.model_fields["request_timeout_s"].default)


@dataclass(frozen=True, slots=True, order=True)
class DeploymentRef:
    """One BatchedDeployment, and so its Service of the same name in the same namespace."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def model_of(deployment: Mapping[str, Any]) -> tuple[DeploymentRef, str]:
    """A BatchedDeployment's reference and the model name in its URLs (`spec.model.name`, by
    default `metadata.name`)."""
    metadata = deployment.get("metadata") or {}
    ref = DeploymentRef(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
    model = ((deployment.get("spec") or {}).get("model") or {}).get("name") or ref.name
    return ref, str(model)


def names_of(deployment: Mapping[str, Any]) -> frozenset[str]:
    """Every name a request may give the deployment's model by: the one in its URLs and the one
    OpenAI clients send as `model` (`spec.model.served_model_name`), as its replicas accept both."""
    _, model = model_of(deployment)
    served = ((deployment.get("spec") or {}).get("model") or {}).get("served_model_name")
    return frozenset({model, str(served)} if served else {model})


def request_timeout_of(deployment: Mapping[str, Any]) -> float:
    """How long a replica of the deployment works on a request before its own 504
    (`spec.batching.request_timeout_s`, the spec's default when unset)."""
    batching = (deployment.get("spec") or {}).get("batching") or {}
    value = batching.get("request_timeout_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else DEFAULT_REQUEST_TIMEOUT_S


# The fields of spec.batching that say a deployment's priority classes.
CLASS_FIELDS = ("priority_classes", "default_priority_class")


def classes_of(deployment: Mapping[str, Any]) -> PriorityClasses:
    """A deployment's priority classes (`spec.batching`), as its replicas read them: the router
    holds, retries and refuses by them what the replicas would."""
    batching = (deployment.get("spec") or {}).get("batching") or {}
    try:
        spec = BatchingSpec.model_validate({key: batching[key] for key in CLASS_FIELDS if key in batching})
    except ValidationError as error:  # the API server validated it: only a newer CRD than this router
        logger.warning(
            "%s: its priority classes are not read, none is named: %s", model_of(deployment)[0], error
        )
        return NO_CLASSES
    return PriorityClasses.of(spec)


def canary_percent_of(deployment: Mapping[str, Any]) -> int:
    """The share of the deployment's requests, in percent, that its canary revision takes now
    (`status.rollout.canary_percent`, which the operator sets to 0 whenever no canary serves)."""
    rollout = (deployment.get("status") or {}).get("rollout") or {}
    value = rollout.get("canary_percent")
    return min(100, max(0, value)) if isinstance(value, int) else 0


def service_of(endpoint_slice: Mapping[str, Any]) -> tuple[DeploymentRef, bool] | None:
    """The deployment whose Service the slice belongs to, and whether that Service is its canary
    revision's (the component label the operator gives it)."""
    metadata = endpoint_slice.get("metadata") or {}
    labels = metadata.get("labels") or {}
    service = labels.get(SERVICE_NAME_LABEL)
    if not service:
        return None
    namespace = str(metadata.get("namespace") or "")
    canary = CANARY_COMPONENT.items() <= labels.items() and bool(labels.get(INSTANCE_LABEL))
    return DeploymentRef(namespace, str(labels[INSTANCE_LABEL] if canary else service)), canary


def ready_replicas(endpoint_slice: Mapping[str, Any]) -> tuple[str, ...]:
    """`host:port` of every ready endpoint of a slice, on the port named `http`.

    A `ready` condition that is absent counts as ready, as the EndpointSlice API says consumers
    should; a terminating endpoint is not ready (unless the Service publishes not-ready addresses).
    """
    port = next(
        (p.get("port") for p in endpoint_slice.get("ports") or [] if p.get("name") == PORT_NAME), None
    )
    if not isinstance(port, int):
        return ()
    ipv6 = endpoint_slice.get("addressType") == "IPv6"
    found = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        addresses = endpoint.get("addresses") or []
        if not addresses or (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        # Every address of one endpoint is the same pod: the first one will do.
        host = f"[{addresses[0]}]" if ipv6 else str(addresses[0])
        found.append(f"{host}:{port}")
    return tuple(sorted(found))


class Listener(Protocol):
    def replicas_changed(self, ref: DeploymentRef, replicas: tuple[str, ...]) -> None: ...

    def deployment_deleted(self, ref: DeploymentRef, model: str) -> None: ...


class Directory:
    """Model names -> deployments -> ready replicas (of the stable revision, and of a canary
    revision with its share of the requests), as last seen by the watches."""

    def __init__(self, listener: Listener | None = None) -> None:
        self.listener = listener
        self._models: dict[DeploymentRef, str] = {}
        self._names: dict[DeploymentRef, frozenset[str]] = {}
        self._timeouts: dict[DeploymentRef, float] = {}
        self._classes: dict[DeploymentRef, PriorityClasses] = {}
        self._by_model: dict[str, set[DeploymentRef]] = {}
        self._slices: dict[tuple[str, str], tuple[DeploymentRef, bool, tuple[str, ...]]] = {}
        self._replicas: dict[DeploymentRef, tuple[str, ...]] = {}
        self._canary_replicas: dict[DeploymentRef, tuple[str, ...]] = {}
        self._canary_percent: dict[DeploymentRef, int] = {}

    # -- reads, per request ----------------------------------------------------------------------
    def resolve(self, model: str) -> DeploymentRef:
        refs = self._by_model.get(model)
        if not refs:
            raise UnknownModel(f"model {model!r}: no BatchedDeployment serves it")
        if len(refs) > 1:
            names = ", ".join(sorted(map(str, refs)))
            raise AmbiguousModel(f"model {model!r}: served by more than one BatchedDeployment ({names})")
        (ref,) = refs
        return ref

    def model_of(self, ref: DeploymentRef) -> str:
        """The model name a deployment serves; UnknownModel when no such deployment is known."""
        model = self._models.get(ref)
        if model is None:
            raise UnknownModel(f"deployment {ref}: no such BatchedDeployment")
        return model

    def replicas(self, ref: DeploymentRef) -> tuple[str, ...]:
        """The stable revision's ready replicas."""
        return self._replicas.get(ref, ())

    def canary(self, ref: DeploymentRef) -> tuple[tuple[str, ...], int]:
        """The canary revision's ready replicas and its share of the requests in percent (0
        when no canary serves, or none of its replicas is ready)."""
        replicas = self._canary_replicas.get(ref, ())
        return replicas, self._canary_percent.get(ref, 0) if replicas else 0

    def request_timeout_s(self, ref: DeploymentRef) -> float:
        return self._timeouts.get(ref, DEFAULT_REQUEST_TIMEOUT_S)

    def classes(self, ref: DeploymentRef) -> PriorityClasses:
        """The priority classes of deployment `ref` (`default` alone when it names none)."""
        return self._classes.get(ref, NO_CLASSES)

    def deployments(self) -> dict[DeploymentRef, str]:
        return dict(self._models)

    def all_replicas(self) -> dict[str, DeploymentRef]:
        return {
            replica: ref
            for tracks in (self._replicas, self._canary_replicas)
            for ref, replicas in tracks.items()
            for replica in replicas
        }

    # -- writes, from the watches ----------------------------------------------------------------
    def put_deployment(self, deployment: Mapping[str, Any]) -> None:
        ref, model = model_of(deployment)
        names = names_of(deployment)
        self._unindex(ref, self._names.get(ref, frozenset()) - names)
        self._models[ref] = model
        self._names[ref] = names
        self._timeouts[ref] = request_timeout_of(deployment)
        self._classes[ref] = classes_of(deployment)
        self._canary_percent[ref] = canary_percent_of(deployment)
        for name in names:
            self._by_model.setdefault(name, set()).add(ref)

    def delete_deployment(self, deployment: Mapping[str, Any]) -> None:
        ref, _ = model_of(deployment)
        self._forget(ref)

    def replace_deployments(self, deployments: Iterable[Mapping[str, Any]], namespace: str | None) -> None:
        """After a fresh list of one namespace (None: all): what is not in it was deleted while no
        watch was open."""
        seen = set()
        for deployment in deployments:
            self.put_deployment(deployment)
            seen.add(model_of(deployment)[0])
        for ref in set(self._models) - seen:
            if namespace is None or ref.namespace == namespace:
                self._forget(ref)

    def put_slice(self, endpoint_slice: Mapping[str, Any]) -> None:
        owner = service_of(endpoint_slice)
        if owner is None:
            return
        self._slices[_slice_key(endpoint_slice)] = (*owner, ready_replicas(endpoint_slice))
        self._recount(owner[0])

    def delete_slice(self, endpoint_slice: Mapping[str, Any]) -> None:
        gone = self._slices.pop(_slice_key(endpoint_slice), None)
        if gone is not None:
            self._recount(gone[0])

    def replace_slices(self, slices: Iterable[Mapping[str, Any]], namespace: str | None) -> None:
        before = {ref for ref, _, _ in self._slices.values()}
        self._slices = {
            key: value for key, value in self._slices.items() if namespace is not None and key[0] != namespace
        }
        for endpoint_slice in slices:
            owner = service_of(endpoint_slice)
            if owner is not None:
                self._slices[_slice_key(endpoint_slice)] = (*owner, ready_replicas(endpoint_slice))
        for ref in before | {ref for ref, _, _ in self._slices.values()}:
            self._recount(ref)

    def _recount(self, ref: DeploymentRef) -> None:
        def ready(canary: bool) -> tuple[str, ...]:
            return tuple(
                sorted(
                    {
                        replica
                        for owner, of_canary, found in self._slices.values()
                        if owner == ref and of_canary == canary
                        for replica in found
                    }
                )
            )

        canaries = ready(True)
        if canaries:
            self._canary_replicas[ref] = canaries
        else:
            self._canary_replicas.pop(ref, None)
        replicas = ready(False)
        if replicas == self._replicas.get(ref, ()):
            return
        if replicas:
            self._replicas[ref] = replicas
        else:
            self._replicas.pop(ref, None)
        if self.listener is not None:
            self.listener.replicas_changed(ref, replicas)

    def _forget(self, ref: DeploymentRef) -> None:
        model = self._models.pop(ref, None)
        self._timeouts.pop(ref, None)
        self._classes.pop(ref, None)
        self._canary_percent.pop(ref, None)
        self._unindex(ref, self._names.pop(ref, frozenset()))
        if model is not None and self.listener is not None:
            self.listener.deployment_deleted(ref, model)

    def _unindex(self, ref: DeploymentRef, names: Iterable[str]) -> None:
        for name in names:
            refs = self._by_model.get(name, set())
            refs.discard(ref)
            if not refs:
                self._by_model.pop(name, None)


def _slice_key(endpoint_slice: Mapping[str, Any]) -> tuple[str, str]:
    metadata = endpoint_slice.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
