"""Status and conditions follow the Deployment's own status; events only on transitions."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from batchd.api.environment import SettingsError
from batchd.api.status import Condition, dump_section
from batchd.operator import status
from batchd.operator.settings import Settings

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=5)


def deployment(
    ready: int,
    *,
    replicas: int = 2,
    updated: int = 2,
    generation: int = 1,
    observed: int = 1,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
            "conditions": conditions or [],
        },
    }


def by_type(conditions: list[Condition]) -> dict[str, dict[str, Any]]:
    """The conditions as the API server stores them, by type."""
    return {condition.type: dump_section(condition) for condition in conditions}


def test_all_ready_and_rolled_out() -> None:
    conditions = by_type(status.conditions_from_deployment(deployment(2), desired=2, generation=3))
    assert conditions["Ready"]["status"] == "True" and conditions["Ready"]["reason"] == "AllReplicasReady"
    assert conditions["Progressing"]["status"] == "False"
    assert conditions["Degraded"]["status"] == "False"
    assert all(condition["observedGeneration"] == 3 for condition in conditions.values())


def test_partly_ready_is_progressing() -> None:
    conditions = by_type(status.conditions_from_deployment(deployment(1), desired=2, generation=1))
    assert conditions["Ready"]["reason"] == "ReplicasNotReady" and conditions["Ready"]["message"] == (
        "1/2 replicas ready"
    )
    assert conditions["Progressing"]["status"] == "True"


def test_stuck_rollout_is_degraded_with_the_deployments_message() -> None:
    stuck = [
        {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": 'ReplicaSet "x" has timed out progressing.',
        }
    ]
    conditions = by_type(
        status.conditions_from_deployment(deployment(0, conditions=stuck), desired=2, generation=1)
    )
    assert conditions["Degraded"]["status"] == "True"
    assert conditions["Degraded"]["message"] == 'ReplicaSet "x" has timed out progressing.'


def test_quota_failure_is_degraded() -> None:
    failure = [
        {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "exceeded quota"}
    ]
    conditions = by_type(
        status.conditions_from_deployment(deployment(0, conditions=failure), desired=1, generation=1)
    )
    assert (conditions["Degraded"]["reason"], conditions["Degraded"]["message"]) == (
        "FailedCreate",
        "exceeded quota",
    )


def test_scaled_to_zero_is_not_a_warning() -> None:
    conditions = status.conditions_from_deployment(
        deployment(0, replicas=0, updated=0), desired=0, generation=1
    )
    assert by_type(conditions)["Ready"]["reason"] == "ScaledToZero"
    assert not any(change.warning for change in status.transitions([], conditions))


def test_invalid_spec_is_degraded_with_the_message() -> None:
    conditions = by_type(status.conditions_for_invalid_spec("spec.model: bad", generation=2))
    assert conditions["Degraded"] == {
        "type": "Degraded",
        "status": "True",
        "reason": "InvalidSpec",
        "message": "spec.model: bad",
        "observedGeneration": 2,
    }


def test_transition_time_moves_only_when_the_status_does() -> None:
    first = status.stamped([], status.conditions_from_deployment(deployment(1), desired=2, generation=1), NOW)
    same = status.stamped(
        first, status.conditions_from_deployment(deployment(1), desired=2, generation=1), LATER
    )
    assert same == first
    ready = status.stamped(
        first, status.conditions_from_deployment(deployment(2), desired=2, generation=1), LATER
    )
    assert by_type(ready)["Ready"]["lastTransitionTime"] == "2026-01-01T00:05:00Z"  # as stored
    assert by_type(ready)["Degraded"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    changes = status.transitions(first, ready)
    assert [(c.type, c.status) for c in changes] == [("Ready", "True"), ("Progressing", "False")]
    assert status.transitions(ready, ready) == []


def test_settings_come_from_the_environment_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env() == Settings()
    for variable, value in {
        "BATCHD_REPLICA_IMAGE": "r:2",
        "BATCHD_NAMESPACES": "a, b",
        "BATCHD_METRICS_PORT": "0",
        "BATCHD_MODEL_LOAD_TIMEOUT_S": "1200",
        "KUBECONFIG": "/tmp/kubeconfig",
    }.items():
        monkeypatch.setenv(variable, value)
    settings = Settings.from_env()
    assert (settings.replica_image, settings.namespaces, settings.metrics_port) == ("r:2", ("a", "b"), 0)
    assert (settings.model_load_timeout_s, settings.kubeconfig) == (1200, "/tmp/kubeconfig")


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("BATCHD_METRICS_PORT", "x", "Input should be a valid integer, unable to parse string as an integer"),
        ("BATCHD_METRICS_PORT", "70000", "Input should be less than or equal to 65535"),
        ("BATCHD_DRAIN_DELAY_S", "-1", "Input should be greater than or equal to 0"),
    ],
)
def test_a_bad_setting_names_the_variable_and_the_value(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, problem: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as refused:
        Settings.from_env()
    assert str(refused.value) == f"{variable}: {problem} (got {value!r})"
