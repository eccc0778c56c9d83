"""What the router knows of the cluster: which deployment serves a model, and its ready replicas.

Fed by the watches (`watching`) with the API server's objects as they change, read per request
without any I/O. The functions that read a BatchedDeployment or an EndpointSlice are pure; the
`Directory` keeps their results and tells its listener when a deployment gains its first ready
replica (held requests go) or goes away (held requests fail).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from batchd.api.access import AccessPolicy
from batchd.api.manifest import lenient_spec
from batchd.api.pod import CANARY, track_of
from batchd.api.priority import NO_CLASSES, PriorityClasses
from batchd.api.spec import BatchedDeploymentSpec, BatchingSpec
from batchd.api.status import read_status
from batchd.router.errors import AmbiguousModel, UnknownModel

logger = logging.getLogger(__name__)

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


def ref_of(deployment: Mapping[str, Any]) -> DeploymentRef:
    metadata = deployment.get("metadata") or {}
    return DeploymentRef(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


# The fields of spec.batching that say a deployment's priority classes.
CLASS_FIELDS = {"priority_classes", "default_priority_class"}


def classes_of(ref: DeploymentRef, batching: BatchingSpec) -> PriorityClasses:
    """A deployment's priority classes, as its replicas read them: the router holds, retries and
    refuses by them what the replicas would. From a lenient spec, the classes are checked together
    again (a default class that is none of them): classes that break a rule name none here, as
    the operator reports the deployment Degraded and its replicas do not start."""
    try:
        checked = BatchingSpec.model_validate(batching.model_dump(include=CLASS_FIELDS))
    except ValidationError as error:
        logger.warning("%s: its priority classes are not read, none is named: %s", ref, error)
        return NO_CLASSES
    return PriorityClasses.of(checked)


# Where a spec sets access that this router cannot read: nobody may call, rather than everyone.
CLOSED = AccessPolicy(open=False, tenants={})


@dataclass(frozen=True, slots=True)
class DeploymentRecord:
    """What the router needs of one BatchedDeployment, read once per change of it: from a lenient
    view of its spec (what this version knows of it) and its typed rollout status."""

    ref: DeploymentRef
    model: str  # the name in its URLs: spec.model.name, by default metadata.name
    names: frozenset[str]  # every name a request may give: also spec.model.served_model_name
    request_timeout_s: float  # how long its replica works on a request before its own 504
    classes: PriorityClasses  # its priority classes, as its replicas read them
    canary_percent: int  # the canary revision's share now (0 whenever no canary serves)
    # Its replicas keep a prefix cache (token-level text generation with prefix_cache_bytes not 0):
    # requests are routed by their prompts' prefixes, salted by caller unless the scope is shared.
    prefix_cached: bool = False
    prefix_by_caller: bool = True  # model.generation.prefix_cache_scope: caller
    max_batch_size: int = 1  # sequences a replica runs at once: the load guard's unit
    access: AccessPolicy = field(default_factory=lambda: CLOSED)  # who may call it (`access`)

    @classmethod
    def of(cls, deployment: Mapping[str, Any]) -> DeploymentRecord:
        ref = ref_of(deployment)
        spec = lenient_spec(deployment.get("spec"))
        rollout = read_status(deployment.get("status")).rollout
        model = spec.model.name or ref.name
        served = spec.model.served_model_name
        generation = spec.model.generation_spec
        cached = (
            spec.model.task == "text-generation"
            and generation.scheduling == "token"
            and generation.prefix_cache_bytes != 0
        )
        return cls(
            ref=ref,
            model=model,
            names=frozenset({model, served} if served else {model}),
            request_timeout_s=spec.batching.request_timeout_s,
            classes=classes_of(ref, spec.batching),
            canary_percent=rollout.canary_percent if rollout is not None else 0,
            prefix_cached=cached,
            prefix_by_caller=generation.prefix_cache_scope == "caller",
            max_batch_size=spec.batching.max_batch_size,
            access=policy_of(ref, deployment.get("spec"), spec),
        )


def policy_of(ref: DeploymentRef, raw: Any, spec: BatchedDeploymentSpec) -> AccessPolicy:
    """Who may call the deployment: `AccessPolicy.of` its spec. A spec.access the lenient read had
    to drop (a rule broken, a newer CRD's shape) closes the deployment: a router that cannot read
    who may call must not let everyone in."""
    if spec.access is None and isinstance(raw, Mapping) and raw.get("access") is not None:
        logger.warning("%s: its spec.access is not read; every request is refused", ref)
        return CLOSED
    return AccessPolicy.of(spec)


def service_of(endpoint_slice: Mapping[str, Any]) -> tuple[DeploymentRef, bool] | None:
    """The deployment whose Service the slice belongs to (by the labels the EndpointSlice
    controller copies from the operator's Services), and whether it is its canary revision's."""
    metadata = endpoint_slice.get("metadata") or {}
    owner = track_of(dict(metadata.get("labels") or {}))
    if owner is None:
        return None
    return DeploymentRef(str(metadata.get("namespace") or ""), owner[0]), owner[1] == CANARY


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
        self._records: dict[DeploymentRef, DeploymentRecord] = {}
        self._by_model: dict[str, set[DeploymentRef]] = {}
        self._slices: dict[tuple[str, str], tuple[DeploymentRef, bool, tuple[str, ...]]] = {}
        self._replicas: dict[DeploymentRef, tuple[str, ...]] = {}
        self._canary_replicas: dict[DeploymentRef, tuple[str, ...]] = {}

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

    def record(self, ref: DeploymentRef) -> DeploymentRecord:
        """The deployment's record; UnknownModel when no such deployment is known."""
        found = self._records.get(ref)
        if found is None:
            raise UnknownModel(f"deployment {ref}: no such BatchedDeployment")
        return found

    def get(self, ref: DeploymentRef) -> DeploymentRecord | None:
        """The deployment's record; None when no such deployment is known."""
        return self._records.get(ref)

    def model_of(self, ref: DeploymentRef) -> str:
        """The model name a deployment serves; UnknownModel when no such deployment is known."""
        return self.record(ref).model

    def replicas(self, ref: DeploymentRef) -> tuple[str, ...]:
        """The stable revision's ready replicas."""
        return self._replicas.get(ref, ())

    def canary(self, ref: DeploymentRef) -> tuple[tuple[str, ...], int]:
        """The canary revision's ready replicas and its share of the requests in percent (0
        when no canary serves, or none of its replicas is ready)."""
        replicas = self._canary_replicas.get(ref, ())
        found = self._records.get(ref)
        return replicas, found.canary_percent if replicas and found is not None else 0

    def request_timeout_s(self, ref: DeploymentRef) -> float:
        found = self._records.get(ref)
        return found.request_timeout_s if found is not None else DEFAULT_REQUEST_TIMEOUT_S

    def classes(self, ref: DeploymentRef) -> PriorityClasses:
        """The priority classes of deployment `ref` (`default` alone when it names none)."""
        found = self._records.get(ref)
        return found.classes if found is not None else NO_CLASSES

    def deployments(self) -> dict[DeploymentRef, str]:
        return {ref: found.model for ref, found in self._records.items()}

    def all_replicas(self) -> dict[str, DeploymentRef]:
        return {
            replica: ref
            for tracks in (self._replicas, self._canary_replicas)
            for ref, replicas in tracks.items()
            for replica in replicas
        }

    # -- writes, from the watches ----------------------------------------------------------------
    def put_deployment(self, deployment: Mapping[str, Any]) -> None:
        record = DeploymentRecord.of(deployment)
        before = self._records.get(record.ref)
        self._unindex(record.ref, (before.names if before is not None else frozenset()) - record.names)
        self._records[record.ref] = record
        for name in record.names:
            self._by_model.setdefault(name, set()).add(record.ref)

    def delete_deployment(self, deployment: Mapping[str, Any]) -> None:
        self._forget(ref_of(deployment))

    def replace_deployments(self, deployments: Iterable[Mapping[str, Any]], namespace: str | None) -> None:
        """After a fresh list of one namespace (None: all): what is not in it was deleted while no
        watch was open."""
        seen = set()
        for deployment in deployments:
            self.put_deployment(deployment)
            seen.add(ref_of(deployment))
        for ref in set(self._records) - seen:
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
        found = self._records.pop(ref, None)
        if found is None:
            return
        self._unindex(ref, found.names)
        if self.listener is not None:
            self.listener.deployment_deleted(ref, found.model)

    def _unindex(self, ref: DeploymentRef, names: Iterable[str]) -> None:
        for name in names:
            refs = self._by_model.get(name, set())
            refs.discard(ref)
            if not refs:
                self._by_model.pop(name, None)


def _slice_key(endpoint_slice: Mapping[str, Any]) -> tuple[str, str]:
    metadata = endpoint_slice.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
