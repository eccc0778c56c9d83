"""The inference routes a replica answers, as plain data: method, path, and where the model name is.

A replica binds a handler to each route; anything in front of replicas (a router) reads the same
table to learn which model a request is for, without importing torch or a web framework. Paths
are matched by plain string tests: a path template holds at most one `{name}`, the model's name,
and the text around it is a fixed prefix and suffix; a route whose path names no model may say
which field of its JSON body does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MODEL_NAME = "{name}"


@dataclass(frozen=True, slots=True)
class Route:
    """One inference route: `operation` names it (the OpenAPI operationId, and what a handler binds to)."""

    operation: str
    method: str
    path: str  # a template: `{name}` stands for the model's name
    # Where the path names no model: the JSON body's field that does (as OpenAI's "model"); with
    # neither, the request is for the one model its replica serves.
    model_field: str | None = None
    # Where a text-generation request's prompt is in the JSON body (a string, a list of prompts, or
    # OpenAI's `messages`): what a router matches against the prefixes a replica may hold.
    prompt_field: str | None = None
    prefix: str = field(init=False, repr=False)
    suffix: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        prefix, found, suffix = self.path.partition(MODEL_NAME)
        if not self.path.startswith("/"):
            raise ValueError(f"route {self.operation!r}: path {self.path!r} must start with '/'")
        if "{" in prefix or "{" in suffix:
            raise ValueError(
                f"route {self.operation!r}: path {self.path!r} may hold one {MODEL_NAME}, no other parameter"
            )
        if found and self.model_field is not None:
            raise ValueError(
                f"route {self.operation!r}: the model is named in the path {self.path!r}, "
                f"so model_field={self.model_field!r} would name it twice"
            )
        object.__setattr__(self, "prefix", prefix if found else self.path)
        object.__setattr__(self, "suffix", suffix)

    @property
    def names_model(self) -> bool:
        """Whether the model's name is in the path (else the replica's one model is meant)."""
        return MODEL_NAME in self.path


@dataclass(slots=True)  # not frozen: one is made per request, and frozen adds to its __init__
class RouteMatch:
    route: Route
    model_name: str | None  # None: the path names no model (see `Route.model_field`)


KSERVE_V1_PREDICT = Route("kserve_v1_predict", "POST", "/v1/models/{name}:predict", prompt_field="instances")
V2_INFER = Route("v2_infer", "POST", "/v2/models/{name}/infer")
V2_GENERATE = Route("v2_generate", "POST", "/v2/models/{name}/generate", prompt_field="text_input")
V2_GENERATE_STREAM = Route(
    "v2_generate_stream", "POST", "/v2/models/{name}/generate_stream", prompt_field="text_input"
)
# OpenAI's API names the model in the body, so that one base URL serves every model.
OPENAI_COMPLETIONS = Route(
    "openai_completions", "POST", "/v1/completions", model_field="model", prompt_field="prompt"
)
OPENAI_CHAT_COMPLETIONS = Route(
    "openai_chat_completions", "POST", "/v1/chat/completions", model_field="model", prompt_field="messages"
)
OPENAI_EMBEDDINGS = Route("openai_embeddings", "POST", "/v1/embeddings", model_field="model")
SIMPLE_CALL_GET = Route("simple_call_get", "GET", "/")
SIMPLE_CALL_POST = Route("simple_call_post", "POST", "/")

INFERENCE_ROUTES: tuple[Route, ...] = (
    KSERVE_V1_PREDICT,
    V2_INFER,
    V2_GENERATE,
    V2_GENERATE_STREAM,
    OPENAI_COMPLETIONS,
    OPENAI_CHAT_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    SIMPLE_CALL_GET,
    SIMPLE_CALL_POST,
)


class RouteTable:
    """Finds the route of a request: prefix and suffix tests for the templated routes of its
    method, in the table's order (a route goes before any it would be shadowed by), then a dict
    lookup for the fixed paths."""

    def __init__(self, routes: Iterable[Route] = INFERENCE_ROUTES) -> None:
        self._fixed: dict[tuple[str, str], Route] = {}
        templated: dict[str, list[Route]] = {}
        seen: dict[tuple[str, str], str] = {}
        for route in routes:
            key = (route.method, route.path)
            if key in seen:
                raise ValueError(
                    f"route {route.operation!r}: {route.method} {route.path} is also {seen[key]!r}"
                )
            seen[key] = route.operation
            if not route.names_model:
                self._fixed[key] = route
                continue
            group = templated.setdefault(route.method, [])
            shadowing = [index for index, other in enumerate(group) if _matches_all_of(other, route)]
            group.insert(shadowing[0] if shadowing else len(group), route)
        self._templated = {method: tuple(group) for method, group in templated.items()}
        self._routes = tuple(seen_route for group in templated.values() for seen_route in group) + tuple(
            self._fixed.values()
        )

    def match(self, method: str, path: str) -> RouteMatch | None:
        """The route and model name of a request, or None when it is no inference route."""
        for route in self._templated.get(method, ()):
            if path.startswith(route.prefix) and path.endswith(route.suffix):
                return RouteMatch(route, path[len(route.prefix) : len(path) - len(route.suffix)])
        fixed = self._fixed.get((method, path))
        return None if fixed is None else RouteMatch(fixed, None)

    def methods_at(self, path: str) -> list[str]:
        """The methods of the routes at `path`, sorted (a 405's `Allow`); empty where there is none."""
        methods = {
            route.method
            for route in self._routes
            if (route.names_model and path.startswith(route.prefix) and path.endswith(route.suffix))
            or (not route.names_model and path == route.path)
        }
        return sorted(methods)


def _matches_all_of(general: Route, specific: Route) -> bool:
    """Whether every path of `specific` matches `general` too (`/{name}/x` vs `/{name}`)."""
    return specific.prefix.startswith(general.prefix) and specific.suffix.endswith(general.suffix)
