"""Fuzz every route of the replica's own OpenAPI document with schemathesis, over real uvicorn.

Every answer must be one the document declares for its route, no answer may be a 5xx, and the
replica must still be alive and serving at the end. The handler is a typed one (`List[int]`),
so that every request schemathesis makes is either a valid item or a malformed one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from batchd.api.manifest import parse_manifest
from batchd.replica.front.app import create_app
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.servers import uvicorn_in_thread

# The last test reads what the fuzzing recorded (CASES): under pytest-xdist (`make test`) the
# module's tests run on one worker, in their order.
pytestmark = pytest.mark.xdist_group("fuzz")

EXAMPLES_PER_OPERATION = 50  # 17 operations: over 500 cases
CASES: list[tuple[str, str, int]] = []  # (method, path, status) of every request made


@pytest.fixture(scope="module")
def replica_url() -> Iterator[str]:
    document = manifest(
        "fuzzed", "batchd.testing.batch_handlers:add_one", batching={"batch_wait_timeout_s": 0.001}
    )
    with uvicorn_in_thread(create_app(parse_manifest(document), ReplicaSettings())) as url:
        yield url


@pytest.fixture(scope="module")
def api(replica_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{replica_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,  # the same cases every run: a failure here is reproducible
)
def test_every_route_answers_only_what_it_declares(case: Any) -> None:
    response = case.call()
    CASES.append((case.method, case.path, response.status_code))
    assert response.status_code < 500, (
        f"{case.method} {case.path}: {response.status_code} {response.text[:300]}"
    )
    case.validate_response(
        response,
        checks=(
            status_code_conformance,
            content_type_conformance,
            response_headers_conformance,
            response_schema_conformance,
        ),
    )


def test_the_fuzzing_was_broad_and_the_replica_survived(replica_url: str) -> None:
    operations = {(method, path) for method, path, _ in CASES}
    assert len(CASES) >= 500 and len(operations) >= 12, (len(CASES), sorted(operations))
    answer = httpx.post(f"{replica_url}/v1/models/fuzzed:predict", json={"instances": [41]}, timeout=10)
    assert answer.json() == {"predictions": [42]}
