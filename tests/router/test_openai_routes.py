"""The router forwards the OpenAI routes of the shared table, finding the model in the body."""

from __future__ import annotations

import pytest

from batchd.router.naming import model_in_body, routed


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v1/embeddings"])
def test_openai_routes_are_forwarded_by_the_model_their_body_names(path: str) -> None:
    found = routed("POST", path)
    assert found is not None and found.model_name is None and found.route.model_field == "model"
    assert model_in_body(b'{"model": "minilm", "input": "hi"}', found.route.model_field) == "minilm"


def test_the_model_listing_is_not_forwarded() -> None:
    # GET /v1/models lists one replica's model; a router serving many answers it itself, or not at all.
    assert routed("GET", "/v1/models") is None
