"""The wire protocols a replica speaks; each turns a request into batch items and results back.

A protocol module binds its inference routes (`batchd.api.routes`) to handlers in its
`ENDPOINTS`; the front and the OpenAPI document are both made from the list here.
"""

from __future__ import annotations

from batchd.replica.front.endpoints import Endpoint
from batchd.replica.front.protocols import generate, kserve_v1, open_inference, openai, simple

ENDPOINTS: tuple[Endpoint, ...] = (
    *kserve_v1.ENDPOINTS,
    *open_inference.ENDPOINTS,
    *generate.ENDPOINTS,
    *openai.ENDPOINTS,
    *simple.ENDPOINTS,
)
