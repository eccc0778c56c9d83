"""Which model a request is for, from its method and path: the replica's inference routes.

The router forwards the path untouched; it only needs the model name to find the deployment.
This is the one place that knows the URL shapes, so that it can give way to the shared table of
routes in `batchd.api` once that exists. Plain string tests, no regex: this runs per request.
"""

from __future__ import annotations

_V1_PREFIX = "/v1/models/"
_V1_SUFFIX = ":predict"
_V2_PREFIX = "/v2/models/"
_V2_SUFFIXES = ("/infer", "/generate", "/generate_stream")


def model_in_path(method: str, path: str) -> str | None:
    """The model name of an inference request (KServe V1, Open Inference V2 and its generate
    extension); None for anything else. An empty name or one with a `/` is no model name."""
    if method != "POST":
        return None
    name: str | None = None
    if path.startswith(_V1_PREFIX) and path.endswith(_V1_SUFFIX):
        name = path[len(_V1_PREFIX) : -len(_V1_SUFFIX)]
    elif path.startswith(_V2_PREFIX):
        for suffix in _V2_SUFFIXES:
            if path.endswith(suffix):
                name = path[len(_V2_PREFIX) : -len(suffix)]
                break
    if not name or "/" in name:
        return None
    return name
