"""The chart's RBAC grants exactly the API calls the real operator makes, nothing it never uses.

The operator runs (real Kopf, real handlers) against the emulated API server through its whole
lifecycle (`batchd.testing.operator_runner.exercise_operator`); every request it sends is recorded as
(API group, resource[/subresource], verb). That set is compared with the rules the chart renders,
cluster-wide and per namespace, and with what a real API server's RBAC would allow.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from batchd.testing.helm import SCENARIOS, render
from batchd.testing.apiserver import observed_api_calls
from batchd.testing.operator_runner import exercise_operator

Call = tuple[str, str, str]


def granted(rules: list[dict[str, Any]]) -> set[Call]:
    """Every (group, resource, verb) the rules allow; wildcards refused outright (least privilege)."""
    calls = set()
    for rule in rules:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    calls.add((group, resource, verb))
    return calls


def rbac_of(values: dict[str, Any]) -> list[set[Call]]:
    """The grants of each of the operator's (Cluster)Roles the chart renders for these values (the
    router's are its own rules, `tests/charts/test_router.py`; the operator's Role to list the
    router pods, where no other grant reaches, is checked there too)."""
    return [
        granted(o["rules"])
        for o in render(values)
        if o["kind"] in ("ClusterRole", "Role")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        and not o["metadata"]["name"].endswith("-router-pods")
    ]


@pytest.fixture(scope="module")
def lifecycle_calls(tmp_path_factory: pytest.TempPathFactory) -> frozenset[Call]:
    """The calls of one whole lifecycle, which includes real replica processes on the stand-in cluster."""
    tmp_path: Path = tmp_path_factory.mktemp("rbac")
    return asyncio.run(exercise_operator(tmp_path))


@pytest.fixture(scope="module")
def operator_calls(lifecycle_calls: frozenset[Call]) -> frozenset[Call]:
    # Calls made by operators elsewhere in this session (the operator's own e2e tests) count too.
    return lifecycle_calls | observed_api_calls()


@pytest.mark.slow
def test_the_lifecycle_exercised_the_operator(lifecycle_calls: frozenset[Call]) -> None:
    # A lenient recorder would make the comparison below pass vacuously.
    assert ("apps", "deployments", "create") in lifecycle_calls
    assert ("apps", "deployments", "patch") in lifecycle_calls
    assert ("serving.batchd.dev", "batcheddeployments", "watch") in lifecycle_calls
    assert ("serving.batchd.dev", "batcheddeployments/status", "patch") in lifecycle_calls
    assert all(
        verb in {"get", "list", "watch", "create", "patch", "delete", "update"}
        for _, _, verb in lifecycle_calls
    )


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["default", "namespaced-values"])
def test_rbac_covers_every_call_the_operator_made(operator_calls: frozenset[Call], scenario: str) -> None:
    roles = rbac_of(SCENARIOS[scenario])
    assert roles
    for grants in roles:
        missing = sorted(operator_calls - grants)
        assert not missing, f"the operator would get 403 Forbidden for {missing}"


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["default", "namespaced-values"])
def test_rbac_grants_nothing_the_operator_never_used(operator_calls: frozenset[Call], scenario: str) -> None:
    for grants in rbac_of(SCENARIOS[scenario]):
        unused = sorted(grants - operator_calls)
        assert not unused, f"granted but never used by the operator: {unused}"


def test_no_rbac_is_rendered_when_turned_off() -> None:
    assert rbac_of({"rbac": {"create": False}}) == []
