"""The chart's RBAC grants exactly the API calls the operator makes: none missing, none spare."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.charts.rendering import SCENARIOS, only, render
from tests.support.operator_harness import exercise_operator


def granted(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_covers_every_call_of_the_operators_lifecycle_and_nothing_else(tmp_path: Path) -> None:
    # The real operator against the emulated API server: create, scale (spec and /scale), ready,
    # a child deleted and one edited, a refused child, a restart and a delete.
    used = asyncio.run(exercise_operator(tmp_path))
    assert used, "the operator made no API call"
    cluster_role = granted(only(render(), "ClusterRole"))
    assert used - cluster_role == set(), "calls the ClusterRole does not allow"
    assert cluster_role - used == set(), "grants the operator never used"
    for role in (o for o in render(SCENARIOS["namespaced-values"]) if o["kind"] == "Role"):
        assert granted(role) == cluster_role
