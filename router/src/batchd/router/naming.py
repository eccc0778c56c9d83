"""Which model a request is for: the shared table of inference routes, read the router's way.

The router forwards the path untouched; it only needs the model's name to find the deployment.
`batchd.api.routes` is the one table of routes the replicas answer, so a route added there is
forwarded here with no change. A route names its model in the path, or in a field of its JSON
body (as OpenAI's `model`); a route that names it in neither (the simple protocol's call, served by
whatever replica a Service picks) is not the router's to forward.
"""

from __future__ import annotations

from typing import Any

import orjson

from batchd.api.routes import RouteMatch, RouteTable
from batchd.router.directory import DeploymentRef
from batchd.router.errors import BadRequest

ROUTES = RouteTable()
# `/deployments/{namespace}/{name}/<path>`: one deployment by name, whatever its model is called and
# whichever namespace also serves a model of that name. The operator gives composed deployments
# such a URL for each callee; `<path>` is forwarded as the replica's own path.
DEPLOYMENT_PREFIX = "/deployments/"


def routed(method: str, path: str) -> RouteMatch | None:
    """The route of an inference request the router forwards; None for anything else, and for a
    path whose model name is empty or holds a `/` (no Kubernetes name does)."""
    found = ROUTES.match(method, path)
    if found is None:
        return None
    if found.model_name is None:
        return found if found.route.model_field is not None else None
    if not found.model_name or "/" in found.model_name:
        return None
    return found


def model_in_body(body: bytes, field: str) -> str:
    """The model a JSON body names in `field`; BadRequest naming the field (and the value) when
    the body is no JSON object or the field holds no model name."""
    return named_model(json_body(body, field), field)


def json_body(body: bytes, field: str) -> Any:
    """A JSON body, read (once: it also names the request's priority class and caller, see
    `batchd.api.priority`); BadRequest when it is no JSON, naming `field`, which it must give."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(
            f"request body: not valid JSON ({error}); expected an object naming {field!r}"
        ) from None


def named_model(document: Any, field: str) -> str:
    """The model a JSON document names in `field`; BadRequest naming the field (and the value)
    when it is no object or the field holds no model name."""
    value = document.get(field) if isinstance(document, dict) else None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"request body: field {field!r} must name the model, got {value!r}")
    return value


def scoped(path: str) -> tuple[DeploymentRef, str] | None:
    """The deployment a `/deployments/{namespace}/{name}/<path>` request names, and the path a
    replica answers; None for any other path, and for one whose names are empty."""
    if not path.startswith(DEPLOYMENT_PREFIX):
        return None
    namespace, _, rest = path[len(DEPLOYMENT_PREFIX) :].partition("/")
    name, slash, inner = rest.partition("/")
    if not namespace or not name or not slash:
        return None
    return DeploymentRef(namespace, name), "/" + inner
