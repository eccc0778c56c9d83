"""The replica's HTTP contract is exact: `schemathesis run --checks all` over its own OpenAPI
document, every route, finds nothing, over real uvicorn.

Every check: no 5xx; every answer's status, headers, content type and body as the document
declares them; no request the document calls valid refused, none it calls invalid accepted;
405 with `Allow` for a method a path does not take. The handler has no type annotation, so
any item the document allows reaches the model, and an item the model fails on alone must be
answered as the client's error, not the server's. The two answers the document declares for
requests no schema can tell from valid ones are in `schemathesis.toml`, with why.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchd.api.manifest import parse_manifest
from batchd.replica.front.app import create_app
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.servers import uvicorn_in_thread

SETTINGS = Path(__file__).with_name("schemathesis.toml")
EXAMPLES_PER_OPERATION = 30  # with schemathesis's coverage cases: over 1,000 requests
SEED = 1  # the same cases every run: a failure here is reproducible with the command it prints


@pytest.fixture(scope="module")
def replica_url() -> Iterator[str]:
    document = manifest(
        "fuzzed", "batchd.testing.batch_handlers:untyped_add_one", batching={"batch_wait_timeout_s": 0.001}
    )
    with uvicorn_in_thread(create_app(parse_manifest(document), ReplicaSettings())) as url:
        yield url


def test_schemathesis_with_every_check_finds_nothing_and_the_replica_serves_on(
    replica_url: str, tmp_path: Path
) -> None:
    operations = sum(
        1
        for path in httpx.get(f"{replica_url}/openapi.json").json()["paths"].values()
        for method in path
        if method in ("get", "put", "post", "delete", "options", "head", "patch", "trace")
    )
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(SETTINGS),
        "run",
        "--checks",
        "all",
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--seed",
        str(SEED),
        "--no-color",
        f"{replica_url}/openapi.json",
    ]
    ran = subprocess.run(  # in tmp_path: schemathesis keeps a cache of what it found where it runs
        command,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
    )
    report = ran.stdout + ran.stderr
    assert ran.returncode == 0, report[-6000:]
    assert f"Tested: {operations}" in report, report[-3000:]  # every route, not only the first
    cases = re.search(r"(\d+) generated, (\d+) passed", report)
    assert cases is not None and int(cases[1]) == int(cases[2]) >= 1000, report[-3000:]
    answer = httpx.post(f"{replica_url}/v1/models/fuzzed:predict", json={"instances": [41]}, timeout=10)
    assert answer.json() == {"predictions": [42]}
