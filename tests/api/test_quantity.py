"""Kubernetes quantities read as the API server reads them, and the memory a pod asks for."""

from __future__ import annotations

import pytest

from batchd.api.quantity import memory_request_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1.5Gi", 1.5 * 2**30), ("1G", 1e9),
     ("128974848", 128974848), ("129e6", 129e6), ("123M", 123e6), ("100m", 0.1), ("1Ki", 1024)],
)  # fmt: skip
def test_quantities_in_every_notation(text: str, value: float) -> None:
    assert parse_quantity(text) == value


def test_what_is_no_quantity_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="'2 GB'"):
        parse_quantity("2 GB")


def test_the_memory_request_else_the_limit_else_none() -> None:
    assert memory_request_bytes({"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}) == 2**30
    assert memory_request_bytes({"limits": {"memory": "2Gi", "cpu": "1"}}) == 2 * 2**30
    assert memory_request_bytes({"requests": {"cpu": "1"}}) is None
    assert memory_request_bytes({}) is None
    assert memory_request_bytes({"requests": {"memory": "lots"}}) is None
