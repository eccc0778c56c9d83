"""A KMock API server taught what a real one does that the operator relies on, and nothing more.

KMock stores objects and serves LIST and WATCH; a real API server also (each as documented in
https://kubernetes.io/docs/reference/using-api/api-concepts/ and the CRD docs):
- fills `uid`, `namespace`, `resourceVersion`, `generation`, `creationTimestamp` on create,
  answers 201, and 409 AlreadyExists for a name that is taken;
- bumps `resourceVersion` on every change, and makes no change (no new version, no watch event)
  for a write that changes nothing; bumps `generation` only when the spec changes;
- answers 409 Conflict for a stale `metadata.resourceVersion`, 422 for a failed JSON-patch
  `test`, 415 for strategic merge patches of custom resources;
- separates the `status` subresource (the main endpoint ignores `.status`, `/status` changes
  nothing else) and serves the `scale` subresource (`autoscaling/v1` Scale);
- validates: custom resources against the CRD (defaults, schema, CEL), built-in kinds against
  the Kubernetes schemas (kubernetes-validate) -> 422 naming the field;
- deletes dependents whose ownerReferences point at a deleted owner (background GC), and keeps
  an object with finalizers until they are removed;
- deletes a Pod that runs on a node gracefully: DELETE sets `deletionTimestamp` (now + the grace
  period) and `deletionGracePeriodSeconds` and keeps the Pod until the kubelet, having stopped its
  containers, deletes it again with `gracePeriodSeconds=0` (a later DELETE may only shorten the
  period); a Pod on no node, or one that has finished, goes at once. Pods start with
  `status.phase: Pending`;
- filters LIST and WATCH by `labelSelector`
  (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/): equality (`a=b`,
  `a==b`, `a!=b`), set (`a in (x,y)`, `a notin (x)`) and existence (`a`, `!a`) requirements,
  comma-joined (AND); on a watch, an object that stops matching arrives as DELETED and one that
  starts matching as ADDED, as the watch cache converts them; a LIST carries the store's
  `resourceVersion`.
Not emulated: watching from a `resourceVersion` (every watch starts with ADDED for what exists, as
one without a version does), `fieldSelector`, `timeoutSeconds`, BOOKMARKs.

Every request is recorded as (group, resource, verb) under its caller's identity, the product of
its User-Agent (`batchd-router`, `kubelet`, ...), so that each component's RBAC test sees only its
own calls; a caller with no identity of the stand-ins' or the router's is the operator.
"""

from __future__ import annotations

import copy
import datetime
import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp.web
import kmock
import kubernetes_validate
from kmock._internal import enums, k8s, rendering

from batchd.api.spec import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from batchd.testing.admission import admit

KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
Call = tuple[str, str, str]  # (API group, resource[/subresource], RBAC verb)
OPERATOR = "operator"
ROUTER = "batchd-router"
# Identities (User-Agent products) that are not the operator: the test's own client, the stand-in
# cluster's components and the router.
NOT_THE_OPERATOR = ("kmock", "kubelet", "kube-controller-manager", ROUTER)

Validator = Callable[[dict[str, Any]], list[str]]


def identity(user_agent: str) -> str:
    """Who called: the User-Agent's product (`batchd-router/0.3 ...` -> `batchd-router`) for the
    known components, `operator` for anyone else (Kopf's and the kubernetes client's agents)."""
    product = user_agent.split("/", 1)[0].strip()
    return product if product in NOT_THE_OPERATOR else OPERATOR


def _requirement(text: str) -> Callable[[Mapping[str, str]], bool]:
    text = text.strip()
    for keyword, wanted in ((" notin ", False), (" in ", True)):
        if keyword in text:
            key, _, values = text.partition(keyword)
            allowed = {value.strip() for value in values.strip().strip("()").split(",")}
            key = key.strip()
            if wanted:
                return lambda labels: labels.get(key) in allowed
            return lambda labels: key not in labels or labels[key] not in allowed
    if "!=" in text:
        key, _, value = text.partition("!=")
        return lambda labels: labels.get(key.strip()) != value.strip()
    if "=" in text:
        key, _, value = text.replace("==", "=").partition("=")
        return lambda labels: labels.get(key.strip()) == value.strip()
    if text.startswith("!"):
        return lambda labels: text[1:].strip() not in labels
    return lambda labels: text in labels


def _split_selector(selector: str) -> list[str]:
    """Requirements are comma-separated, except for the commas inside `in (...)` sets."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [part for part in [*parts, current] if part.strip()]


def selects(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether a `labelSelector` (the query parameter's syntax) selects these labels; "" selects all."""
    return all(_requirement(part)(labels) for part in _split_selector(selector))


def labels_of(document: Any) -> Mapping[str, str]:
    return ((document or {}).get("metadata") or {}).get("labels") or {}


def _error(status: int, reason: str, message: str) -> k8s.KubernetesError:
    return k8s.KubernetesError(status=status, reason=reason, message=message, details={})


def _timestamp(moment: datetime.datetime | None = None) -> str:
    return (moment or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def validate_builtin(document: dict[str, Any]) -> list[str]:
    """The real Kubernetes schemas, strict (unknown fields refused), for every supported version."""
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path) or "(root)"
            problems.append(f"{where}: {error.message} (Kubernetes {version})")
    return problems


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    return (
        [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")] if path else []
    )


def json_patch(target: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 JSON patch (add, remove, replace, test): the operations Kopf and kubectl send."""
    document = copy.deepcopy(target)
    for operation in operations:
        *parents, leaf = _pointer(operation["path"])
        node: Any = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        op = operation["op"]
        if op == "test":
            actual = node[int(leaf)] if isinstance(node, list) else node.get(leaf)
            if actual != operation.get("value"):
                raise _error(
                    422,
                    "Invalid",
                    f"the JSON patch test at {operation['path']} failed: "
                    f"{actual!r} != {operation.get('value')!r}",
                )
        elif op in ("add", "replace"):
            if isinstance(node, list):
                index = len(node) if leaf == "-" else int(leaf)
                node[index : index + (op == "replace")] = [copy.deepcopy(operation["value"])]
            else:
                node[leaf] = copy.deepcopy(operation["value"])
        elif op == "remove":
            if isinstance(node, list):
                del node[int(leaf)]
            else:
                node.pop(leaf)
        else:
            raise _error(422, "Invalid", f"JSON patch operation {op!r} is not supported here")
    return document


def _spec_of(document: dict[str, Any]) -> dict[str, Any]:
    """What `generation` counts changes of: everything but metadata and status."""
    return {key: value for key, value in document.items() if key not in ("metadata", "status")}


class Resource:
    """What the emulator knows about one kind: discovery, subresources, validation."""

    def __init__(
        self,
        group: str,
        plural: str,
        kind: str,
        *,
        version: str = "v1",
        namespaced: bool = True,
        subresources: tuple[str, ...] = (),
        validator: Validator | None = None,
        replicas_path: tuple[str, ...] = ("spec", "replicas"),
        custom: bool = False,
        initial_status: dict[str, Any] | None = None,
        graceful: bool = False,
    ) -> None:
        self.key = kmock.resource(group, version, plural)
        self.group, self.plural, self.kind, self.custom = group, plural, kind, custom
        self.api_version = f"{group}/{version}" if group else version
        self.subresources = subresources
        self.validator = validator
        self.replicas_path = replicas_path
        self.initial_status = initial_status  # what the API server sets on create, whatever was sent
        self.graceful = graceful  # deletion waits for the kubelet (pods)
        self.info = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            subresources=set(subresources),
            verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
        )


def _admit_custom(document: dict[str, Any]) -> list[str]:
    defaulted, problems = admit(document)
    document.clear()
    document.update(defaulted)  # defaulting happens in place, as in the API server
    return problems


def default_resources(validate_children: bool = True) -> list[Resource]:
    children_validator = validate_builtin if validate_children else None
    bd = Resource(
        GROUP,
        PLURAL,
        KIND,
        version=VERSION,
        subresources=("status", "scale"),
        validator=_admit_custom,
        replicas_path=("spec", "num_replicas"),
        custom=True,
    )
    bd.info.shortnames = set(SHORT_NAMES)
    bd.info.singular = SINGULAR
    return [
        Resource("", "namespaces", "Namespace", namespaced=False),
        Resource("", "configmaps", "ConfigMap", validator=children_validator),
        Resource("", "services", "Service", subresources=("status",), validator=children_validator),
        Resource("", "events", "Event"),
        Resource(
            "",
            "pods",
            "Pod",
            subresources=("status",),
            validator=children_validator,
            initial_status={"phase": "Pending"},
            graceful=True,
        ),
        Resource("events.k8s.io", "events", "Event"),
        Resource("discovery.k8s.io", "endpointslices", "EndpointSlice", validator=children_validator),
        Resource("policy", "poddisruptionbudgets", "PodDisruptionBudget", validator=children_validator),
        Resource(
            "apps",
            "deployments",
            "Deployment",
            subresources=("status", "scale"),
            validator=children_validator,
        ),
        bd,
    ]


class ApiServer(kmock.KubernetesEmulator):
    """The KMock emulator with the API server behaviours listed in the module docstring."""

    kubeconfig_path: str  # set by the harness once the server listens

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.known: dict[Any, Resource] = {}
        self.revision = 0
        self.refused: list[tuple[str, str, list[str]]] = []  # (kind, name, problems) answered with 422
        self.calls: list[Call] = []  # the operator's, in order
        self.calls_by: dict[str, set[Call]] = {}  # identity -> every call it made
        self.posted_events: list[dict[str, Any]] = []
        self.live_uids: set[str] = set()

    def register(self, resources: list[Resource]) -> None:
        for resource in resources:
            self.known[resource.key] = resource
            self.resources[resource.key] = resource.info

    # -- recording -------------------------------------------------------------------------------------
    @property
    def router_calls(self) -> frozenset[Call]:
        """Every call the router made (User-Agent `batchd-router/...`), for its RBAC test."""
        return frozenset(self.calls_by.get(ROUTER, set()))

    def _record(self, request: rendering.Request) -> None:
        if request.resource is None or not request.resource.plural:
            return  # discovery (/api, /apis/GROUP): open to every authenticated client, not RBAC-bound
        method = request.method.value.upper() if request.method else ""
        if request.params.get("watch") in ("true", "1"):
            verb = "watch"
        elif method == "GET":
            verb = "get" if request.name else "list"
        else:
            verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}.get(
                method, method
            )
        plural = request.resource.plural or ""
        if request.subresource:
            plural = f"{plural}/{request.subresource}"
        call = (request.resource.group or "", plural, verb)
        caller = identity(str(request.headers.get("User-Agent", "")))
        self.calls_by.setdefault(caller, set()).add(call)
        if caller == OPERATOR:
            self.calls.append(call)

    # -- dispatch --------------------------------------------------------------------------------------
    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        self._record(request)
        resource = self.known.get(request.resource) if request.resource is not None else None
        if resource is None or request.action is None:
            return await super()._handle(request)
        if request.action == enums.action.CREATE:
            return await self._create(request, resource)
        if request.action == enums.action.UPDATE:
            return await self._patch(request, resource)
        if request.action == enums.action.DELETE and request.name:
            return await self._delete(request, resource)
        if request.action == enums.action.FETCH and request.subresource:
            return await self._fetch_subresource(request, resource)
        # Reads are KMock's own, called directly: its reaction matching scans every past request
        # for each new one, which makes long runs (the benchmark) quadratic.
        if request.action == enums.action.FETCH:
            return aiohttp.web.json_response(await self._serve_fetch(request))
        if request.action == enums.action.LIST:
            return aiohttp.web.json_response(await self._serve_list(request))
        if request.action == enums.action.WATCH and request._raw_request is not None:
            return await self._stream_watch(request)
        return await super()._handle(request)

    async def _serve_list(self, request: rendering.Request) -> Any:
        listed: Any = await super()._serve_list(request)
        selector = request.params.get("labelSelector", "")
        listed["items"] = [item for item in listed["items"] if selects(selector, labels_of(item))]
        listed["metadata"] = {"resourceVersion": str(self.revision)}
        return listed

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        """KMock's watch (ADDED for what exists, then every change), seen through the selector: a
        change that makes an object match is ADDED, one that makes it stop matching DELETED."""
        selector = request.params.get("labelSelector", "")
        matching: set[tuple[str, str]] = set()
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict) or not selector:
                yield event
                continue
            metadata = event["object"].get("metadata") or {}
            key = (metadata.get("namespace", ""), metadata.get("name", ""))
            if event["type"] != "DELETED" and selects(selector, labels_of(event["object"])):
                yield {**event, "type": "MODIFIED" if key in matching else "ADDED"}
                matching.add(key)
            elif key in matching:
                matching.discard(key)
                yield {**event, "type": "DELETED"}

    async def _stream_watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        assert request._raw_request is not None
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        async for event in self._serve_watch(request):
            if event != b"":  # KMock's marker that the headers may go out
                await response.write(json.dumps(event).encode() + b"\n")
        return response

    def _next_revision(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _validate(self, resource: Resource, document: dict[str, Any]) -> None:
        if resource.validator is None:
            return
        problems = resource.validator(document)
        if problems:
            name = document.get("metadata", {}).get("name", "")
            self.refused.append((resource.kind, name, problems))
            raise _error(422, "Invalid", f'{resource.kind} "{name}" is invalid: ' + "; ".join(problems))

    async def _emit(self, resource: Resource, kind: str, document: dict[str, Any]) -> None:
        await self._buses[resource.key].put({"type": kind, "object": copy.deepcopy(document)})

    def _stored(self, resource: Resource, namespace: str | None, name: str) -> Any:
        key = (resource.key, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            raise _error(404, "NotFound", f'{resource.plural} "{name}" not found')
        return self._objects[key]

    # -- create ----------------------------------------------------------------------------------------
    async def _create(self, request: rendering.Request, resource: Resource) -> aiohttp.web.StreamResponse:
        document = copy.deepcopy(request.data) if isinstance(request.data, dict) else None
        if document is None:
            raise _error(400, "BadRequest", "the body must be a JSON object")
        metadata = document.setdefault("metadata", {})
        if request.namespace and metadata.get("namespace", request.namespace) != request.namespace:
            raise _error(400, "BadRequest", "the namespace of the object does not match the request's")
        if not metadata.get("name"):
            if not metadata.get("generateName"):
                raise _error(
                    422, "Invalid", "metadata.name: Required value: name or generateName is required"
                )
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace:
            metadata["namespace"] = request.namespace
        document.pop("status", None) if "status" in resource.subresources else None
        if resource.initial_status is not None:
            document["status"] = copy.deepcopy(resource.initial_status)
        self._validate(resource, document)
        metadata = document["metadata"]  # defaulting may have replaced it
        async with self._lock:
            key = (resource.key, request.namespace, metadata["name"])
            if key in self._objects and not self._objects[key].deleted:
                raise _error(409, "AlreadyExists", f'{resource.plural} "{metadata["name"]}" already exists')
            metadata.update(
                uid=str(uuid.uuid4()),
                resourceVersion=self._next_revision(),
                generation=1,
                creationTimestamp=_timestamp(),
            )
            if key in self._objects:
                self._objects[key].create(document)
            else:
                self._objects[key] = document
            if resource.plural == "events":
                self.posted_events.append(document)
            self.live_uids.add(metadata["uid"])
            await self._emit(resource, "ADDED", document)
            owners = [owner.get("uid") for owner in metadata.get("ownerReferences", []) or []]
            if owners and not any(uid in self.live_uids for uid in owners):
                # The garbage collector deletes a dependent whose owners are all gone (created racing
                # the owner's deletion); here it happens at once, which is one of its valid orders.
                await self._delete_one(resource, self._objects[key], copy.deepcopy(document))
        return aiohttp.web.json_response(document, status=201)

    # -- patch -----------------------------------------------------------------------------------------
    def _patched(
        self, request: rendering.Request, resource: Resource, current: dict[str, Any]
    ) -> dict[str, Any]:
        content_type = str(request.headers.get("Content-Type", "")).split(";")[0].strip()
        body = request.data
        if request.subresource == "scale":
            replicas = (body or {}).get("spec", {}).get("replicas") if isinstance(body, dict) else None
            if not isinstance(replicas, int):
                raise _error(422, "Invalid", "spec.replicas: Invalid value: must be an integer")
            *parents, leaf = resource.replicas_path
            scaled = copy.deepcopy(current)
            node = scaled
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = replicas
            return scaled
        if content_type == "application/merge-patch+json":
            stale = (
                (body or {}).get("metadata", {}).get("resourceVersion") if isinstance(body, dict) else None
            )
            if stale is not None and stale != current["metadata"]["resourceVersion"]:
                raise _error(
                    409,
                    "Conflict",
                    "the object has been modified; please apply your changes "
                    "to the latest version and try again",
                )
            patched: dict[str, Any] = merge_patch(current, body)
            return patched
        if content_type == "application/json-patch+json" and isinstance(body, list):
            return json_patch(current, body)
        if content_type == "application/strategic-merge-patch+json" and resource.custom:
            raise _error(
                415, "UnsupportedMediaType", "strategic merge patch is not supported for custom resources"
            )
        raise _error(415, "UnsupportedMediaType", f"this emulator does not apply {content_type!r} patches")

    async def _patch(self, request: rendering.Request, resource: Resource) -> aiohttp.web.StreamResponse:
        assert request.name is not None
        async with self._lock:
            stored = self._stored(resource, request.namespace, request.name)
            current = copy.deepcopy(stored.raw)
            updated = self._patched(request, resource, current)
            if request.subresource == "status":
                updated = {**current, "status": updated.get("status")}  # only the status moves
            elif "status" in resource.subresources:
                updated["status"] = current.get("status")  # the main endpoint ignores the status
                if updated["status"] is None:
                    updated.pop("status")
            # System fields are the server's, whatever the patch said.
            for field in ("uid", "creationTimestamp", "generation", "resourceVersion", "namespace", "name"):
                if field in current["metadata"]:
                    updated.setdefault("metadata", {})[field] = current["metadata"][field]
            if updated == current:  # nothing changed: no new version, no event
                unchanged = self._scale(resource, current) if request.subresource == "scale" else current
                return aiohttp.web.json_response(unchanged)
            if request.subresource != "status":
                self._validate(resource, updated)
            if _spec_of(updated) != _spec_of(current):
                updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
            updated["metadata"]["resourceVersion"] = self._next_revision()
            meta = updated["metadata"]
            if (
                meta.get("deletionTimestamp")
                and not meta.get("finalizers")
                and not meta.get("deletionGracePeriodSeconds")  # a pod waits for its kubelet
            ):
                stored.create(updated)
                stored.delete()
                self.live_uids.discard(meta["uid"])
                await self._emit(resource, "DELETED", updated)
                await self._collect_garbage(meta["uid"])
            else:
                stored.create(updated)
                await self._emit(resource, "MODIFIED", updated)
        if request.subresource == "scale":
            return aiohttp.web.json_response(self._scale(resource, updated))
        return aiohttp.web.json_response(updated)

    # -- delete and garbage collection ----------------------------------------------------------------
    async def _delete(self, request: rendering.Request, resource: Resource) -> aiohttp.web.StreamResponse:
        assert request.name is not None
        requested = _requested_grace_period(request)
        async with self._lock:
            stored = self._stored(resource, request.namespace, request.name)
            document = copy.deepcopy(stored.raw)
            await self._delete_one(resource, stored, document, requested)
        return aiohttp.web.json_response(document)

    async def _delete_one(
        self, resource: Resource, stored: Any, document: dict[str, Any], grace_s: int | None = None
    ) -> None:
        meta = document["metadata"]
        period = _grace_period_s(resource, document, grace_s)
        if meta.get("deletionTimestamp") and period >= (meta.get("deletionGracePeriodSeconds") or 0):
            return  # already being deleted; a later DELETE may only shorten the grace period
        if period > 0 or meta.get("finalizers"):
            deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=period)
            meta["deletionTimestamp"] = _timestamp(deadline)
            meta["deletionGracePeriodSeconds"] = period
            meta["resourceVersion"] = self._next_revision()
            stored.create(document)
            await self._emit(resource, "MODIFIED", document)
            return
        stored.delete()
        self.live_uids.discard(meta["uid"])
        await self._emit(resource, "DELETED", document)
        await self._collect_garbage(meta["uid"])

    async def _collect_garbage(self, owner_uid: str) -> None:
        """Background propagation: every dependent of a deleted owner is deleted in turn."""
        for (key, _namespace, _name), stored in list(self._objects.items()):
            if stored.deleted or key not in self.known:
                continue
            owners = stored.raw.get("metadata", {}).get("ownerReferences", []) or []
            if any(owner.get("uid") == owner_uid for owner in owners):
                await self._delete_one(self.known[key], stored, copy.deepcopy(stored.raw))

    # -- scale -----------------------------------------------------------------------------------------
    def _scale(self, resource: Resource, document: dict[str, Any]) -> dict[str, Any]:
        node: Any = document
        for part in resource.replicas_path:
            node = (node or {}).get(part)
        meta = document["metadata"]
        status = document.get("status", {}) or {}
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion") if key in meta
            },
            "spec": {"replicas": node or 0},
            "status": {"replicas": status.get("replicas", 0), "selector": status.get("selector", "")},
        }

    async def _fetch_subresource(
        self, request: rendering.Request, resource: Resource
    ) -> aiohttp.web.StreamResponse:
        assert request.name is not None
        async with self._lock:
            stored = self._stored(resource, request.namespace, request.name)
            document = copy.deepcopy(stored.raw)
        if request.subresource == "scale" and "scale" in resource.subresources:
            return aiohttp.web.json_response(self._scale(resource, document))
        if request.subresource == "status" and "status" in resource.subresources:
            return aiohttp.web.json_response(document)
        raise _error(404, "NotFound", f"no subresource {request.subresource!r}")

    # -- test helpers ------------------------------------------------------------------------------------
    def get_object(self, resource: Resource | str, namespace: str, name: str) -> dict[str, Any] | None:
        known = self.known_by_plural(resource)
        key = (known.key, namespace, name)
        if key not in self._objects or self._objects[key].deleted:
            return None
        return copy.deepcopy(self._objects[key].raw)

    def list_objects(self, resource: Resource | str, namespace: str | None = None) -> list[dict[str, Any]]:
        known = self.known_by_plural(resource)
        return [
            copy.deepcopy(stored.raw)
            for (key, ns, _), stored in self._objects.items()
            if key == known.key and not stored.deleted and (namespace is None or ns == namespace)
        ]

    def known_by_plural(self, resource: Resource | str) -> Resource:
        if isinstance(resource, Resource):
            return resource
        group, _, plural = resource.rpartition("/")
        for known in self.known.values():
            if known.plural == plural and known.group == group.split("/")[0]:
                return known
        raise KeyError(resource)


def _requested_grace_period(request: rendering.Request) -> int | None:
    """`gracePeriodSeconds` from the query or the DeleteOptions body; None = the object's own."""
    value = request.params.get("gracePeriodSeconds")
    if value is None and isinstance(request.data, dict):
        value = request.data.get("gracePeriodSeconds")
    if value is None:
        return None
    try:
        return max(0, int(value))
    except (TypeError, ValueError):
        raise _error(400, "BadRequest", f"gracePeriodSeconds: not an integer: {value!r}") from None


def _grace_period_s(resource: Resource, document: dict[str, Any], requested: int | None) -> int:
    """How long deletion waits, as the API server's pod strategy decides it; 0 for other kinds."""
    if not resource.graceful:
        return 0
    spec = document.get("spec") or {}
    if not spec.get("nodeName") or (document.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0  # no kubelet runs it, or its containers are done: nothing to wait for
    if requested is not None:
        return requested
    return int(spec.get("terminationGracePeriodSeconds", 30))


def kubeconfig_for(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {"token": "kmock-token"}}],
        "contexts": [
            {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"}}
        ],
        "current-context": "kmock",
    }


def dump_json(document: Any) -> str:
    return json.dumps(document, sort_keys=True)
